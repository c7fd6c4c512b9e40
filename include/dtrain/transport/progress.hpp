#pragma once
/// @file
/// Progress policies: how a thread waiting for a transport operation spends its time.
///
/// A policy is a type with `static bool wait(completion_flag&, deadline)` and `spin_micros`, the
/// time a waiter polls before it sleeps. Either way the transport makes progress without the
/// waiter; the policy decides how the waiter spends the time.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

#include "dtrain/core/deadline.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace dtrain {

/// The completion state of one operation, as waited on by a progress policy.
class completion_flag {
 public:
  bool done() const noexcept { return done_.load(std::memory_order_acquire); }

  /// Marks the operation finished and wakes its waiters. Called once, by whichever thread
  /// finished the operation.
  void set() noexcept {
    {
      std::lock_guard lock(m_);
      done_.store(true, std::memory_order_release);
    }
    cv_.notify_all();
  }

  /// Blocks until set or `d` passes. @returns whether it was set.
  bool block_until(deadline d) noexcept {
    std::unique_lock lock(m_);
    return cv_.wait_until(lock, d.time(), [&] { return done(); });
  }

 private:
  std::atomic<bool> done_{false};
  std::mutex m_;
  std::condition_variable cv_;
};

/// Blocks: no CPU while waiting. The default, and the right choice whenever ranks share cores.
/// (The TCP transport blocks in the socket's poll and reads the message on the waiting thread.)
struct blocking {
  static constexpr int spin_micros = 0;
  static bool wait(completion_flag& f, deadline d) noexcept { return f.done() || f.block_until(d); }
};

/// Spins for `SpinMicros` microseconds before blocking: for latency-bound jobs with a core to
/// spare per rank. Spinning on a machine with fewer cores than busy threads slows everything.
template <int SpinMicros = 50>
struct spin_then_block {
  static_assert(SpinMicros >= 0, "the spin time cannot be negative");
  static constexpr int spin_micros = SpinMicros;
  static bool wait(completion_flag& f, deadline d) noexcept {
    auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(SpinMicros);
    if (until > d.time()) until = d.time();
    while (!f.done()) {
      if (std::chrono::steady_clock::now() >= until) return f.block_until(d);
#if defined(__x86_64__) || defined(__i386__)
      _mm_pause();
#endif
    }
    return true;
  }
};

}  // namespace dtrain
