#pragma once
/// @file
/// Progress policies: how a thread waiting for a transport operation spends its time.
///
/// A policy is a type with `spin_micros`: how long a waiter polls without sleeping before it
/// blocks. The transport makes progress either way; the policy decides how the waiter spends
/// the time.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

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

  /// Spins for `spin` (bounded by `d`), then blocks until set or `d` passes.
  /// @returns whether it was set.
  bool wait(deadline d, std::chrono::microseconds spin) noexcept {
    auto until = std::min(deadline::clock::now() + spin, d.time());
    while (!done()) {
      if (deadline::clock::now() >= until) return block_until(d);
#if defined(__x86_64__) || defined(__i386__)
      _mm_pause();
#endif
    }
    return true;
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
};

/// Spins for `SpinMicros` microseconds before blocking (the shared-memory transport counts them
/// from the last byte it saw move): for latency-bound jobs with a core to spare per rank.
/// Spinning on a machine with fewer cores than busy threads slows everything.
template <int SpinMicros = 50>
struct spin_then_block {
  static_assert(SpinMicros >= 0, "the spin time cannot be negative");
  static constexpr int spin_micros = SpinMicros;
};

namespace detail {
/// Whether a group of `ranks` outnumbers this host's cores (taking every rank to be here): a
/// spinning waiter then yields its core, so the rank it waits for can run (Open MPI's
/// yield-when-idle on oversubscription).
inline bool more_ranks_than_cores(int ranks) noexcept {
  return static_cast<unsigned>(ranks) > std::max(1u, std::thread::hardware_concurrency());
}
}  // namespace detail

}  // namespace dtrain
