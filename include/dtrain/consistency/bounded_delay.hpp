#pragma once
/// @file
/// Bounded delay, the Parameter Server paper's consistency (Li et al., OSDI 2014, section 3.3):
/// "a new task will be blocked until all previous tasks tau times ago have been finished".
/// tau = 0 is sequential consistency, tau = infinity eventual consistency.
///
/// How it differs from SSP: SSP(s) bounds how far workers drift *apart* (a worker at clock c
/// waits while the slowest worker has not finished c - s; its own pushes may still be in flight).
/// Bounded delay bounds how far a caller runs ahead of its *own* tasks' completion (task t
/// starts only once every task of its before t - tau has finished: pushed, applied and, for a
/// pull, answered), and never waits for another worker. So one worker alone never blocks under
/// SSP, but under bounded delay 0 it runs strictly one task at a time; and two workers of very
/// different speeds drift apart without bound under bounded delay, at most s + 1 clocks under SSP.
///
/// <!-- frame: header_bounded_delay -->
/// @code
/// auto finish = [&](ps_worker::request& r) { worker.wait(r); };  // ps_worker: a ps::worker's type
/// dtrain::task_window<ps_worker::request, decltype(finish)> window(/*tau=*/2, finish);
/// for (std::int64_t t = 0; t < steps; ++t) {
///   window.admit(t);                     // waits for the tasks before t - 2
///   window.started(t, worker.push_pull(keys, grads(t), weights, 1));
/// }
/// window.drain();
/// @endcode

#include <cstdint>
#include <deque>
#include <string_view>
#include <utility>

#include "dtrain/consistency/policies.hpp"
#include "dtrain/core/error.hpp"

namespace dtrain {

/// The server side of bounded delay: workers never wait for each other (as ASP) and pushes
/// apply on arrival; the bound `Tau` is kept by each caller's `task_window`. A model of
/// `consistency`.
template <std::int64_t Tau>
struct bounded_delay {
  static_assert(Tau >= 0, "the delay bound is a number of tasks");
  static constexpr std::string_view name = "bounded_delay";
  /// The tasks a caller may start beyond its oldest unfinished one.
  static constexpr std::int64_t task_delay = Tau;
  std::int64_t staleness_bound() const noexcept { return unbounded; }
  bool may_advance(std::int64_t, std::int64_t) const noexcept { return true; }
  int pushes_to_apply(int) const noexcept { return 1; }
  std::int64_t visible_clock(std::int64_t) const noexcept { return -1; }
};

/// A caller's tasks under bounded delay tau: task t may start only when every earlier task
/// numbered below t - tau has finished. `Handle` is what a started task returns; finishing it
/// is `finish(handle)`, a callable given at construction (a PS worker's `wait`, a request's
/// `wait`). Tasks are numbered 0, 1, 2, ... in the order they start.
template <class Handle, class Finish>
class task_window {
 public:
  task_window(std::int64_t tau, Finish finish) : tau_(tau), finish_(std::move(finish)) {
    if (tau < 0) throw error(errc::invalid_argument, "task_window: the delay bound must be 0 or more");
  }

  /// Blocks until task `t` may start: finishes, oldest first, every task numbered below t - tau.
  /// @throws dtrain::error (invalid_argument) if `t` is not the next task number; what
  ///   `finish` throws.
  void admit(std::int64_t t) {
    if (t != next_) {
      throw error(errc::invalid_argument, "task_window: task " + std::to_string(t) + " where task " +
                                              std::to_string(next_) + " was next");
    }
    while (!running_.empty() && running_.front().first < t - tau_) finish_oldest();
  }

  /// Records that task `t` (just admitted) started and will be finished through `h`.
  void started(std::int64_t t, Handle h) {
    running_.emplace_back(t, std::move(h));
    next_ = t + 1;
  }

  /// Finishes every task still running.
  void drain() {
    while (!running_.empty()) finish_oldest();
  }

  /// Tasks started and not yet finished through this window.
  std::size_t in_flight() const noexcept { return running_.size(); }

 private:
  void finish_oldest() {
    auto task = std::move(running_.front());
    running_.pop_front();
    finish_(task.second);
  }

  std::int64_t tau_;
  Finish finish_;
  std::int64_t next_ = 0;
  std::deque<std::pair<std::int64_t, Handle>> running_;
};

}  // namespace dtrain
