#pragma once
// Retrying with exponential backoff under a deadline: how every dtrain connection is made, since
// the peer it dials may not be listening yet.

#include <algorithm>
#include <chrono>
#include <thread>

#include "dtrain/core/deadline.hpp"

namespace dtrain::detail {

enum class attempt { done, retry, give_up };

/// Calls `try_once()` until it returns `done` or `give_up`, or `d` passes (then the result is
/// `retry`), sleeping 10 ms between tries, doubling up to `cap`.
template <class TryOnce>
attempt retry_with_backoff(deadline d, std::chrono::milliseconds cap, TryOnce try_once) {
  auto pause = std::chrono::milliseconds(10);
  while (true) {
    attempt a = try_once();
    if (a != attempt::retry || d.expired()) return a;
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(pause, d.remaining()));
    pause = std::min(pause * 2, cap);
  }
}

}  // namespace dtrain::detail
