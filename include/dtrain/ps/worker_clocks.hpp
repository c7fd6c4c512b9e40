#pragma once
/// @file
/// `ps::worker_clocks`: what a server knows of each of its workers: the clock it is at, whether
/// it said hello, said goodbye or was dropped as dead, and when it was last heard from. The
/// consistency rules read `slowest()` and `live()`; the liveness check asks `overdue`. A late
/// worker (`roles::late_workers`) is absent until it arrives: it holds nobody back, and is not
/// overdue, before then.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/core/error.hpp"

namespace dtrain::ps {

class worker_clocks {
 public:
  using clock = std::chrono::steady_clock;
  /// `slowest()` once no worker is live: later than every clock.
  static constexpr std::int64_t done_clock = std::numeric_limits<std::int64_t>::max();

  /// `late` of the `workers` (the last ones) are absent until they arrive.
  explicit worker_clocks(int workers, int late = 0)
      : clocks_(static_cast<std::size_t>(workers), 0),
        finished_(clocks_.size(), false),
        dead_(clocks_.size(), false),
        greeted_(clocks_.size(), false),
        absent_(clocks_.size(), false),
        last_seen_(clocks_.size(), clock::now()) {
    for (int w = std::max(workers - late, 0); w < workers; ++w) absent_[static_cast<std::size_t>(w)] = true;
  }

  std::size_t workers() const noexcept { return clocks_.size(); }
  std::int64_t clock_of(std::size_t w) const noexcept { return clocks_[w]; }
  const std::vector<std::int64_t>& clocks() const noexcept { return clocks_; }
  bool dead(std::size_t w) const noexcept { return dead_[w]; }
  bool has_finished(std::size_t w) const noexcept { return finished_[w]; }
  bool absent(std::size_t w) const noexcept { return absent_[w]; }
  /// Worker `w` is at clock `c` (a new head learning where a worker stands).
  void set_clock(std::size_t w, std::int64_t c) { clocks_[w] = c; }

  /// Every clock, from a checkpoint.
  void restore(std::vector<std::int64_t> clocks) { clocks_ = std::move(clocks); }

  /// Worker `w` sent something now.
  void heard_from(std::size_t w) { last_seen_[w] = clock::now(); }
  /// How long since worker `w` last sent anything.
  clock::duration silent_for(std::size_t w) const { return clock::now() - last_seen_[w]; }
  void greeted(std::size_t w) { greeted_[w] = true; }
  void finished(std::size_t w) { finished_[w] = true; }
  void drop(std::size_t w) { dead_[w] = true; }
  /// Late worker `w` joined the running job at clock `c`: it counts from now on.
  void arrive(std::size_t w, std::int64_t c) {
    absent_[w] = false;
    greeted_[w] = true;
    clocks_[w] = c;
    last_seen_[w] = clock::now();
  }
  /// The clock a worker entering now starts at: past every round in progress, so none of them
  /// waits for it (the slowest live worker's clock + 1, or the furthest + 1 when none is live).
  std::int64_t entry_clock() const noexcept { return (live() > 0 ? slowest() : fastest()) + 1; }

  /// Worker `w` finished clock `c`, which must be the one it is at.
  /// @throws dtrain::error `protocol_error` otherwise.
  void advance(std::size_t w, std::int64_t c) {
    if (c != clocks_[w]) {
      throw error(errc::protocol_error, "worker " + std::to_string(w) + " finished clock " + std::to_string(c) +
                                            " but the server expected " + std::to_string(clocks_[w]));
    }
    ++clocks_[w];
  }

  /// Whether worker `w` is present, neither finished nor dropped.
  bool is_live(std::size_t w) const noexcept { return !finished_[w] && !dead_[w] && !absent_[w]; }

  /// Workers present, neither finished nor dropped.
  int live() const noexcept {
    int n = 0;
    for (std::size_t w = 0; w < clocks_.size(); ++w) n += is_live(w);
    return n;
  }

  /// The clock of the slowest live worker; `done_clock` when none is live.
  std::int64_t slowest() const noexcept {
    std::int64_t s = done_clock;
    for (std::size_t w = 0; w < clocks_.size(); ++w) {
      if (is_live(w)) s = std::min(s, clocks_[w]);
    }
    return s;
  }

  /// The furthest clock any worker reached.
  std::int64_t fastest() const noexcept {
    return clocks_.empty() ? 0 : *std::max_element(clocks_.begin(), clocks_.end());
  }

  /// A live worker silent for too long: one that never said hello within `hello_timeout` of
  /// `start`, or, once greeted, sent nothing for `heartbeat_timeout`.
  struct silence {
    std::size_t worker;
    bool never_greeted;
    std::chrono::milliseconds silent_for;
  };

  /// The first live worker silent past its limit, if any.
  std::optional<silence> overdue(clock::time_point start, std::chrono::milliseconds hello_timeout,
                                 std::chrono::milliseconds heartbeat_timeout) const {
    const auto now = clock::now();
    for (std::size_t w = 0; w < clocks_.size(); ++w) {
      if (!is_live(w)) continue;
      const bool never = !greeted_[w];
      const auto since = now - (never ? start : last_seen_[w]);
      if (since <= (never ? hello_timeout : heartbeat_timeout)) continue;
      return silence{w, never, std::chrono::duration_cast<std::chrono::milliseconds>(since)};
    }
    return std::nullopt;
  }

 private:
  std::vector<std::int64_t> clocks_;
  std::vector<bool> finished_, dead_, greeted_, absent_;
  std::vector<clock::time_point> last_seen_;
};

}  // namespace dtrain::ps
