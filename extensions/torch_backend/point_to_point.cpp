#include "point_to_point.hpp"

#include <algorithm>
#include <cstddef>
#include <chrono>
#include <system_error>
#include <utility>

#include "dtrain/core/error.hpp"

namespace dtrain::torch_backend {
namespace {
// While transfers are in flight the thread sleeps between looks at them, from `first_look` up to
// `longest_sleep` (doubling while nothing finishes), so a pending receive costs no core; a new
// call wakes it at once. A transfer that finishes is noticed within the current sleep.
constexpr std::chrono::microseconds first_look{20};
constexpr std::chrono::microseconds longest_sleep{1000};
// How long a send still in flight when the group shuts down may take (the TCP transport's own).
constexpr std::chrono::seconds linger{10};
}  // namespace

void point_to_point::submit(call c) {
  {
    std::lock_guard lock(m_);
    if (stopping_) return complete(c, shut_down(c));
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

void point_to_point::complete(call& c, std::exception_ptr failure, int source) noexcept {
  try {
    c.complete(std::move(failure), source);
  } catch (...) {  // completing a work does not throw; nothing else could be told
  }
}

std::exception_ptr point_to_point::shut_down(const call& c) {
  return std::make_exception_ptr(error(errc::cancelled, "dtrain: " + c.what + ": the group was shut down"));
}

bool point_to_point::settle(in_flight& f) {
  if (!f.r.test() && !f.c.due.expired()) return false;
  std::error_code ec;
  if (!f.r.wait(f.c.due, ec)) {
    std::string text = "dtrain: " + f.c.what;
    if (!f.r.detail().empty()) text += " (" + f.r.detail() + ")";
    f.r.cancel();  // a receive past its deadline lets go of the tensor before the work fails
    complete(f.c, std::make_exception_ptr(error(ec, text)));  // error appends ec.message()
    return true;
  }
  try {
    const int source = f.c.finish(f.r);
    complete(f.c, nullptr, source);
  } catch (...) {
    complete(f.c, std::current_exception());
  }
  return true;
}

void point_to_point::run() {
  std::vector<in_flight> flying;  // in call order
  std::chrono::microseconds sleep = first_look;
  bool stopping = false;
  for (;;) {
    std::deque<call> fresh;
    {
      std::unique_lock lock(m_);
      const auto news = [&] { return !incoming_.empty() || stopping_ != stopping; };
      if (flying.empty()) {
        wake_.wait(lock, news);
      } else {
        wake_.wait_for(lock, sleep, news);
      }
      fresh.swap(incoming_);
      stopping = stopping_;
    }
    for (auto& c : fresh) {
      if (stopping && !c.is_send) {  // called before the shutdown, but no one will send to it now
        complete(c, shut_down(c));
        continue;
      }
      try {
        request r = c.post();
        flying.push_back({std::move(r), std::move(c)});
      } catch (...) {
        complete(c, std::current_exception());
      }
    }
    if (stopping) {  // receives no one will send to any more fail now; sends get the linger time
      for (auto& f : flying) {
        if (!f.c.is_send) f.r.cancel();
        f.c.due = std::min(f.c.due, deadline::after(linger));
      }
    }
    std::size_t kept = 0;
    for (std::size_t i = 0; i < flying.size(); ++i) {
      if (settle(flying[i])) continue;
      if (kept != i) flying[kept] = std::move(flying[i]);
      ++kept;
    }
    const bool moved = kept < flying.size() || !fresh.empty();
    flying.erase(flying.begin() + static_cast<std::ptrdiff_t>(kept), flying.end());
    if (stopping && flying.empty()) return;
    sleep = moved ? first_look : std::min(2 * sleep, longest_sleep);
  }
}

}  // namespace dtrain::torch_backend
