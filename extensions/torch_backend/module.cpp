// The Python module `dtrain_torch`: importing it registers the torch.distributed backend
// "dtrain", so `torch.distributed.init_process_group("dtrain", ...)` and `new_group(backend=
// "dtrain")` build dtrain process groups.

#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>

#include "process_group.hpp"

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
