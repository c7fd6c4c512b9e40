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

#if defined(__linux__)
#include <sched.h>
#endif

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

/// Blocks: no CPU while waiting: the right choice whenever ranks share cores. (The TCP transport
/// blocks in the socket's poll and reads the message on the waiting thread.)
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

/// The process transports' default: waits as `spin_then_block<SpinMicros>` where this host has
/// two cores for each of the group's ranks on it, and blocks where it has fewer. A waiting rank
/// then spins on a core of its own while its other thread (the caller's compute, the transport's
/// reader) keeps another, so the spin takes no core another rank needs. Each transport decides
/// once, when formed, from its ranks on this host (a shared-memory group's size; a TCP group's
/// peers whose connections share an address with this rank's end) and the cores this process may
/// run on: alike on every rank of a host whose ranks have the same affinity.
template <int SpinMicros = 1000>
struct spin_with_spare_cores {
  static_assert(SpinMicros >= 0, "the spin time cannot be negative");
  static constexpr int spin_micros = SpinMicros;
  static constexpr bool only_with_spare_cores = true;
};

/// What `tcp_transport`, `shm_transport` and `mixed_transport` wait with.
using default_progress = spin_with_spare_cores<>;

/// Whether transport `t` has two cores for each of its group's ranks on this host (its
/// `spare_cores()`); false for one that cannot tell.
template <class Transport>
bool spare_cores_of(const Transport& t) noexcept {
  if constexpr (requires { t.spare_cores(); }) {
    return t.spare_cores();
  } else {
    return false;
  }
}

namespace detail {
/// The cores this process may run on: its affinity mask (taskset, a cgroup's cpuset, a
/// launcher's binding), else every online core.
inline unsigned usable_cores() noexcept {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) {
    return static_cast<unsigned>(CPU_COUNT(&set));
  }
#endif
  return std::max(1u, std::thread::hardware_concurrency());
}

/// Whether a group's `ranks` on this host leave two of its `cores` to each.
inline bool spare_cores_for(int ranks, unsigned cores = usable_cores()) noexcept {
  return 2ull * static_cast<unsigned long long>(std::max(ranks, 1)) <= cores;
}

/// Whether a group of `ranks` outnumbers this host's cores (taking every rank to be here): a
/// spinning waiter then yields its core, so the rank it waits for can run (Open MPI's
/// yield-when-idle on oversubscription).
inline bool more_ranks_than_cores(int ranks) noexcept { return static_cast<unsigned>(ranks) > usable_cores(); }

/// How long a waiter under `Progress` spins on a transport that has (`spare`) or has not two
/// cores for each of its ranks here.
template <class Progress>
constexpr std::chrono::microseconds spin_for(bool spare) noexcept {
  if constexpr (requires { Progress::only_with_spare_cores; }) {
    if (!spare) return std::chrono::microseconds(0);
  }
  return std::chrono::microseconds(Progress::spin_micros);
}
}  // namespace detail

}  // namespace dtrain
