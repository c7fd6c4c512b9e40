// The Python module `dtrain_torch`: importing it registers the torch.distributed backend
// "dtrain", so `torch.distributed.init_process_group("dtrain", ...)` and `new_group(backend=
// "dtrain")` build dtrain process groups. `dtrain_torch.log_to_python()` routes dtrain's
// diagnostics to Python's `logging`.

#include <pybind11/chrono.h>
#include <pybind11/eval.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dtrain/core/log.hpp"
#include "process_group.hpp"

namespace {

// The lines dtrain logs while they go to Python. dtrain calls its handler from its own threads,
// under its log lock, where taking the GIL could deadlock against a Python thread that holds it
// and waits for dtrain: the handler only queues the line, and a Python thread (log_to_python's)
// hands it to `logging`.
struct log_queue {
  static constexpr std::size_t capacity = 4096;  // beyond it the oldest lines go, counted
  std::mutex m;
  std::condition_variable ready;
  std::deque<std::pair<int, std::string>> lines;
  std::size_t dropped = 0;
};

log_queue& queued_lines() {
  static auto* q = new log_queue;  // never freed: dtrain's threads may log during exit
  return *q;
}

// Python's logging levels for dtrain's.
int python_level(dtrain::log_level level) noexcept {
  switch (level) {
    case dtrain::log_level::error: return 40;
    case dtrain::log_level::warn: return 30;
    case dtrain::log_level::info: return 20;
    case dtrain::log_level::debug: return 10;
  }
  return 30;
}

void to_queue(dtrain::log_level level, std::string_view text) noexcept {
  try {
    auto& q = queued_lines();
    {
      std::lock_guard lock(q.m);
      if (q.lines.size() >= log_queue::capacity) {
        q.lines.pop_front();
        ++q.dropped;
      }
      q.lines.emplace_back(python_level(level), std::string(text));
    }
    q.ready.notify_one();
  } catch (...) {  // a line that cannot be queued is lost; logging never throws into dtrain
  }
}

// The lines queued so far, waiting up to `patience` for one; a note first where some were lost.
std::vector<std::pair<int, std::string>> take_lines(std::chrono::duration<double> patience) {
  auto& q = queued_lines();
  std::unique_lock lock(q.m);
  q.ready.wait_for(lock, patience, [&] { return !q.lines.empty(); });
  std::vector<std::pair<int, std::string>> out;
  if (q.dropped > 0) {
    out.emplace_back(30, std::to_string(q.dropped) + " lines lost: more than " +
                             std::to_string(log_queue::capacity) + " waited for Python's logging");
    q.dropped = 0;
  }
  for (auto& line : q.lines) out.push_back(std::move(line));
  q.lines.clear();
  return out;
}

// The Python half of log_to_python: the thread that hands queued lines to `logging`.
constexpr const char* log_route = R"(
import atexit as _atexit, logging as _logging, threading as _threading

_route = None

def log_to_python(enable=True, logger="dtrain"):
    """Sends dtrain's diagnostics to Python's logging, to the logger named `logger`, at levels
    ERROR, WARNING, INFO and DEBUG, instead of stderr ("dtrain warn: ..."); enable=False sends
    them to stderr again. DTRAIN_LOG (error, warn, info, debug; default warn) still decides which
    lines dtrain produces; the logger's own level and handlers decide what is shown."""
    global _route
    _route_lines(False)
    if _route is not None:  # the lines queued so far still go to the logger they were meant for
        _route[1].set()
        _route[0].join()
        _route = None
    if not enable:
        return
    target, stop = _logging.getLogger(logger), _threading.Event()

    def hand_over():
        while True:
            lines = _take_lines(0.1)
            for level, text in lines:
                target.log(level, text)
            if stop.is_set() and not lines:
                return

    thread = _threading.Thread(target=hand_over, name="dtrain-log", daemon=True)
    thread.start()
    _route = (thread, stop)
    _route_lines(True)

def _after_fork():  # a forked child has no hand-over thread: its lines go to stderr
    global _route
    _route_lines(False)
    _route = None

import os as _os
_os.register_at_fork(after_in_child=_after_fork)
# The thread ends while Python still runs; lines logged after it (while groups close at exit)
# go to stderr.
_atexit.register(log_to_python, False)
)";

}  // namespace

PYBIND11_MODULE(dtrain_torch, m) {
  m.doc() = "dtrain as a torch.distributed backend: import it, then init_process_group(\"dtrain\", ...)";
  // Forming the group waits for every rank: other Python threads run meanwhile, as with Gloo.
  m.def("create_process_group", &dtrain::torch_backend::dtrain_process_group::create, pybind11::arg("store"),
        pybind11::arg("rank"), pybind11::arg("world_size"), pybind11::arg("timeout"),
        pybind11::call_guard<pybind11::gil_scoped_release>(),
        "The creator torch.distributed calls for the \"dtrain\" backend");
  // Groups left alive end while Python still runs (close_all says why).
  pybind11::module_::import("atexit").attr("register")(
      pybind11::cpp_function([] { dtrain::torch_backend::dtrain_process_group::close_all(); }));
  m.def("_route_lines", [](bool to_python) { dtrain::set_log_handler(to_python ? to_queue : nullptr); });
  m.def("_take_lines", [](double seconds) { return take_lines(std::chrono::duration<double>(seconds)); },
        pybind11::call_guard<pybind11::gil_scoped_release>());
  pybind11::exec(log_route, m.attr("__dict__"));

  auto backend = pybind11::module_::import("torch.distributed").attr("Backend");
  if (pybind11::hasattr(backend, "DTRAIN")) return;
  // torch 2 asks which devices a backend serves: CPU tensors, and CUDA tensors staged through the
  // host (one dtrain group serves both); 1.13 takes no such argument.
  try {
    using namespace pybind11::literals;
    backend.attr("register_backend")("dtrain", m.attr("create_process_group"),
                                     "devices"_a = std::vector{"cpu", "cuda"});
  } catch (const pybind11::error_already_set& e) {
    if (!e.matches(PyExc_TypeError)) throw;
    backend.attr("register_backend")("dtrain", m.attr("create_process_group"));
  }
}
