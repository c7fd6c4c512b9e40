#include "point_to_point.hpp"

#include <algorithm>
#include <chrono>
#include <system_error>
#include <utility>

#include "dtrain/core/error.hpp"

namespace dtrain::torch_backend {
namespace {
// How long the thread waits on the oldest transfer before it looks at the others and at newly
// submitted calls again: the most a finished transfer behind it, or a new call, waits.
constexpr std::chrono::microseconds look_again{200};
// How long a send still in flight when the group shuts down may take (the TCP transport's own).
constexpr std::chrono::seconds linger{10};
}  // namespace

void point_to_point::submit(call c) {
  {
    std::lock_guard lock(m_);
    if (stopping_) {
      fail(c, std::make_exception_ptr(error(errc::cancelled, "dtrain: " + c.what + ": the group was shut down")));
      return;
    }
    incoming_.push_back(std::move(c));
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  }
  wake_.notify_one();
}

void point_to_point::stop() noexcept {
  {
    std::lock_guard lock(m_);
    if (stopping_) return;
    stopping_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void point_to_point::fail(call& c, std::exception_ptr failure) noexcept {
  try {
    c.complete(std::move(failure), -1);
  } catch (...) {  // completing a work does not throw; nothing else could be told
  }
}

bool point_to_point::settle(in_flight& f) {
  if (!f.r.test() && !f.c.due.expired()) return false;
  std::error_code ec;
  if (!f.r.wait(f.c.due, ec)) {
    std::string text = "dtrain: " + f.c.what;
    if (!f.r.detail().empty()) text += " (" + f.r.detail() + ")";
    f.r.cancel();  // a receive past its deadline lets go of the tensor before the work fails
    fail(f.c, std::make_exception_ptr(error(ec, text)));  // error appends ec.message()
    return true;
  }
  int source = -1;
  std::exception_ptr failure;
  try {
    source = f.c.finish(f.r);
  } catch (...) {
    failure = std::current_exception();
  }
  try {
    f.c.complete(failure, source);
  } catch (...) {
  }
  return true;
}

void point_to_point::run() {
  std::vector<in_flight> flying;  // in call order
  for (;;) {
    std::deque<call> fresh;
    bool stopping = false;
    {
      std::unique_lock lock(m_);
      if (flying.empty()) wake_.wait(lock, [&] { return stopping_ || !incoming_.empty(); });
      fresh.swap(incoming_);
      stopping = stopping_;
    }
    for (auto& c : fresh) {
      if (stopping) {
        fail(c, std::make_exception_ptr(error(errc::cancelled, "dtrain: " + c.what + ": the group was shut down")));
        continue;
      }
      try {
        request r = c.post();
        flying.push_back({std::move(r), std::move(c)});
      } catch (...) {
        fail(c, std::current_exception());
      }
    }
    if (stopping) {  // receives no one will send to any more fail now; sends get the linger time
      for (auto& f : flying) {
        if (!f.c.is_send) f.r.cancel();
        f.c.due = std::min(f.c.due, deadline::after(linger));
      }
    }
    flying.erase(std::remove_if(flying.begin(), flying.end(), [](in_flight& f) { return settle(f); }), flying.end());
    if (stopping && flying.empty()) return;
    if (!flying.empty()) {
      std::error_code ignored;  // settled above, on the next pass
      flying.front().r.wait(std::min(flying.front().c.due, deadline::after(look_again)), ignored);
    }
  }
}

}  // namespace dtrain::torch_backend
