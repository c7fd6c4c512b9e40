#pragma once
/// @file
/// `detail::comm_thread`: the thread a trainer hands its gradient buckets to (the allreduce
/// trainer's, the pipeline trainer's replicas). It owns the collective while the compute thread
/// runs the backward pass; jobs run in the order they were posted, so buckets go out in the same
/// order on every rank.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "dtrain/core/trace.hpp"

namespace dtrain::detail {

/// Runs jobs, in the order they were queued, on one thread that owns the collective.
class comm_thread {
 public:
  explicit comm_thread(trace::recorder& tracer) : tracer_(tracer), thread_([this] { run(); }) {}
  comm_thread(const comm_thread&) = delete;
  comm_thread& operator=(const comm_thread&) = delete;
  ~comm_thread() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

  void post(std::function<void()> job) {
    {
      std::lock_guard lock(mutex_);
      jobs_.push_back(std::move(job));
      ++posted_;
    }
    wake_.notify_all();
  }

  /// Waits until every posted job has run; rethrows the first failure (once).
  void drain() {
    std::unique_lock lock(mutex_);
    done_cv_.wait(lock, [&] { return finished_ == posted_; });
    if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
  }

  /// Seconds spent running jobs so far.
  double busy_seconds() const {
    std::lock_guard lock(mutex_);
    return busy_;
  }

 private:
  void run() {
    tracer_.name_thread("communication");
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      auto job = std::move(jobs_.front());
      jobs_.pop_front();
      const bool skip = failed_;  // after a failure the collective is broken: skip, finish fast
      lock.unlock();
      const auto t0 = std::chrono::steady_clock::now();
      std::exception_ptr e;
      if (!skip) {
        try {
          job();
        } catch (...) {
          e = std::current_exception();
        }
      }
      const auto t1 = std::chrono::steady_clock::now();
      lock.lock();
      busy_ += std::chrono::duration<double>(t1 - t0).count();
      if (e && !failed_) {
        failed_ = true;
        failure_ = e;
      }
      ++finished_;
      done_cv_.notify_all();
    }
  }

  mutable std::mutex mutex_;
  std::condition_variable wake_, done_cv_;
  std::deque<std::function<void()>> jobs_;
  std::uint64_t posted_ = 0, finished_ = 0;
  bool stop_ = false, failed_ = false;
  std::exception_ptr failure_;
  double busy_ = 0;
  trace::recorder& tracer_;
  std::thread thread_;  // last: starts once everything above exists
};

}  // namespace dtrain::detail
