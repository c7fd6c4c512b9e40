#pragma once
/// @file
/// What the parameter server's parts report, for logs, reports and benchmarks: `server_stats`
/// (a shard's updates, requests, bytes, and the staleness of every update, overall and per
/// worker) and `worker_stats` (a worker's requests, bytes and waiting).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace dtrain::ps {

/// What a server has done, for logs and the observability of issue 6.
struct server_stats {
  std::uint64_t version = 0;        ///< updates applied to this server's own shard
  /// Updates this server applied as a head: to its own shard, and to those it took over from a
  /// lost server or grew into. A copy's updates are its head's: summed over the servers, each
  /// update of the job counts once.
  std::uint64_t head_updates = 0;
  std::uint64_t pushes = 0, pulls = 0, clocks = 0;
  std::uint64_t keys_pushed = 0, keys_pulled = 0;
  std::uint64_t bytes_in = 0, bytes_out = 0;
  std::size_t max_deferred = 0;     ///< the longest queue of pulls and clocks waiting for others
  std::vector<std::uint64_t> staleness_histogram = std::vector<std::uint64_t>(33, 0);  ///< [32] counts >= 32
  /// The same, per worker: `per_worker_staleness[w][s]`.
  std::vector<std::vector<std::uint64_t>> per_worker_staleness;
  std::size_t deferred_now = 0;     ///< pulls and clocks waiting at the moment of the snapshot
  /// Counts an update from worker `w` applied `s` versions after the one it was computed from.
  void record_staleness(std::uint32_t w, std::uint64_t s) {
    const std::size_t bucket = std::min<std::size_t>(s, 32);
    ++staleness_histogram[bucket];
    ++per_worker_staleness[w][bucket];
  }
  /// The histogram's mean.
  double mean_staleness() const noexcept {
    double n = 0, sum = 0;
    for (std::size_t s = 0; s < staleness_histogram.size(); ++s) {
      n += static_cast<double>(staleness_histogram[s]);
      sum += static_cast<double>(s * staleness_histogram[s]);
    }
    return n > 0 ? sum / n : 0;
  }
};

/// What a worker has sent and received, and how long it waited.
struct worker_stats {
  std::uint64_t pushes = 0, pulls = 0, clocks = 0;
  std::uint64_t keys_pushed = 0, keys_pulled = 0;
  std::uint64_t bytes_out = 0, bytes_in = 0;
  double wait_seconds = 0;
  /// Per shard: push and push_pull requests the shard's head acknowledged (a request sent again
  /// after a fail-over counts once).
  std::vector<std::uint64_t> pushes_acknowledged;
  /// Versions the server had applied beyond this worker's basis when its pushes arrived are
  /// counted by the servers; here: how many server versions each pull advanced (a pull-side view).
  std::vector<std::uint64_t> pull_advance_histogram = std::vector<std::uint64_t>(33, 0);
};

/// What replication has done on one server (summed over the shards it holds).
struct replication_stats {
  std::uint64_t forwarded = 0;  ///< updates this server applied as a head and sent down its chain
  std::uint64_t applied = 0;    ///< updates applied as a copy of another head's shard
  std::uint64_t relayed = 0;    ///< updates passed on to the next copy
  std::uint64_t resent = 0;     ///< updates sent again to a new successor after a loss
  std::uint64_t bytes = 0;      ///< bytes sent to other servers
  std::uint64_t held_replies = 0;  ///< replies that waited for the tail
};

}  // namespace dtrain::ps
