#pragma once
/// @file
/// `ps::shard_updates`: a server's two tables (sparse keys, dense slices) and the one way updates
/// reach them. An update is applied through the updater with the staleness measured for it,
/// counted as one version, and first sent down the shard's chain (ps/replication.hpp), so the
/// copy travels while the head applies it.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "dtrain/concepts/transport.hpp"
#include "dtrain/concepts/updater.hpp"
#include "dtrain/ps/key_cache.hpp"
#include "dtrain/ps/protocol.hpp"
#include "dtrain/ps/push_rounds.hpp"
#include "dtrain/ps/replication.hpp"
#include "dtrain/ps/stats.hpp"
#include "dtrain/ps/table.hpp"

namespace dtrain::ps {

template <transport Transport, std::floating_point T, class Updater, class Initializer>
class shard_updates {
 public:
  using table_type = table<T, Updater, Initializer>;

  /// @param stats where versions and staleness are counted (the server's; it outlives this)
  shard_updates(Updater u, Initializer init, apply_mode mode, chain_replicator<Transport, T> replication, server_stats& stats)
      : sparse_(u, init, mode), dense_(std::move(u), std::move(init), mode), replication_(std::move(replication)), stats_(stats) {}

  table_type& table_of(table_id which) noexcept { return which == table_id::sparse ? sparse_ : dense_; }
  table_type& sparse() noexcept { return sparse_; }
  table_type& dense() noexcept { return dense_; }
  chain_replicator<Transport, T>& replication() noexcept { return replication_; }

  /// Versions applied since the worker read the parameters its push was computed from.
  std::uint64_t staleness_of(std::uint64_t basis) const noexcept { return stats_.version - std::min(basis, stats_.version); }

  /// One push that is its own mean, straight into its table as one update.
  /// @param frame the received request `values` lie in, if they do (the chain's copy takes it)
  void apply_single(Transport& t, std::uint32_t worker, table_id which, std::span<const key_type> keys,
                    std::span<const T> values, std::size_t length, std::uint64_t basis, resolved_keys* resolved = nullptr,
                    std::vector<std::byte>* frame = nullptr) {
    const std::uint64_t s = staleness_of(basis);
    stats_.record_staleness(worker, s);
    if (!keys.empty()) {
      replication_.forward(t, which, keys, values, length, s, frame);
      table_of(which).push(keys, values, length, {s, 1.0}, resolved);
    }
    ++stats_.version;
  }

  /// `apply_single`, then the keys' new values into `out`, in one pass over the keys.
  void apply_and_read(Transport& t, std::uint32_t worker, table_id which, std::span<const key_type> keys,
                      std::span<const T> values, std::span<T> out, std::size_t length, std::uint64_t basis,
                      resolved_keys* resolved, std::vector<std::byte>* frame) {
    const std::uint64_t s = staleness_of(basis);
    stats_.record_staleness(worker, s);
    if (!keys.empty()) {
      replication_.forward(t, which, keys, values, length, s, frame);
      table_of(which).push_pull(keys, values, out, length, {s, 1.0}, resolved);
    }
    ++stats_.version;
  }

  /// Applies a group of pushes as one update, the mean over its `contributions` (a worker's
  /// clock may span several requests, slices or servers' shares: it counts once).
  void apply_group(Transport& t, std::vector<pending_push<T>>& group, std::size_t contributions) {
    if (group.empty()) return;
    if (group.size() == 1 && contributions == 1) {
      const pending_push<T>& p = group.front();
      apply_single(t, p.worker, p.which, p.keys, p.values, p.length, p.basis);
      return;
    }
    double staleness = 0;
    for (const auto& p : group) {
      const std::uint64_t s = staleness_of(p.basis);
      staleness += static_cast<double>(s);
      stats_.record_staleness(p.worker, s);
    }
    const step_info info{static_cast<std::uint64_t>(staleness / static_cast<double>(group.size()) + 0.5), 1.0};
    // Gradients are averaged over the group; summation mode adds every push as it is.
    const T scale = sparse_.mode() == apply_mode::sum ? T(1) : T(1) / static_cast<T>(contributions);
    for (const group_mean<T>& m : mean_of(group, scale)) {
      replication_.forward(t, m.which, m.keys, m.values, m.length, info.staleness);
      table_of(m.which).push(m.keys, m.values, m.length, info);
    }
    ++stats_.version;
  }

  /// An update of another head's shard, as this server's copy of it.
  void apply_copy(table_id which, std::span<const key_type> keys, std::span<const T> values, std::size_t length,
                  std::uint64_t staleness) {
    table_of(which).push(keys, values, length, {staleness, 1.0});
  }

 private:
  table_type sparse_, dense_;
  chain_replicator<Transport, T> replication_;
  server_stats& stats_;
};

}  // namespace dtrain::ps
