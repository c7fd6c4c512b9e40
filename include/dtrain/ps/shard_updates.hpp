#pragma once
/// @file
/// `ps::shard_updates`: a shard's two tables (sparse keys, dense slices), as one server holds
/// them, and the one way updates reach them. An update is applied through the updater with the
/// staleness measured for it, counted as one version of the shard, and first sent down the
/// shard's chain (ps/replication.hpp), so the copy travels while the head applies it.

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

  /// @param stats where staleness is counted (the server's; it outlives this)
  shard_updates(Updater u, Initializer init, apply_mode mode, shard_chain<Transport, T> replication,
                server_stats& stats)
      : sparse_(u, init, mode),
        dense_(std::move(u), std::move(init), mode),
        replication_(std::move(replication)),
        stats_(&stats) {}

  table_type& table_of(table_id which) noexcept { return which == table_id::sparse ? sparse_ : dense_; }
  table_type& sparse() noexcept { return sparse_; }
  table_type& dense() noexcept { return dense_; }
  shard_chain<Transport, T>& replication() noexcept { return replication_; }

  /// Updates applied to the shard (by this server, or by the heads it holds a copy for).
  std::uint64_t version() const noexcept { return version_; }
  void set_version(std::uint64_t v) noexcept { version_ = v; }

  /// Versions applied since the worker read the parameters its push was computed from.
  std::uint64_t staleness_of(std::uint64_t basis) const noexcept { return version_ - std::min(basis, version_); }

  /// One push that is its own mean (worker `from.worker`'s request `from.id`, or the only push
  /// of a round), straight into its table as one update.
  /// @param frame the received request `values` lie in, if they do (the chain's copy takes it)
  void apply_single(Transport& t, update_origin from, std::uint32_t worker, table_id which,
                    std::span<const key_type> keys, std::span<const T> values, std::size_t length, std::uint64_t basis,
                    resolved_keys* resolved = nullptr, std::vector<std::byte>* frame = nullptr) {
    const std::uint64_t s = staleness_of(basis);
    stats_->record_staleness(worker, s);
    if (!keys.empty()) {
      replication_.forward(t, which, keys, values, length, s, from, frame);
      table_of(which).push(keys, values, length, {s, 1.0}, resolved);
    }
    applied_as_head();
  }

  /// `apply_single`, then the keys' new values into `out`, in one pass over the keys.
  void apply_and_read(Transport& t, update_origin from, table_id which, std::span<const key_type> keys,
                      std::span<const T> values, std::span<T> out, std::size_t length, std::uint64_t basis,
                      resolved_keys* resolved, std::vector<std::byte>* frame) {
    const std::uint64_t s = staleness_of(basis);
    stats_->record_staleness(from.worker, s);
    if (!keys.empty()) {
      replication_.forward(t, which, keys, values, length, s, from, frame);
      table_of(which).push_pull(keys, values, out, length, {s, 1.0}, resolved);
    }
    applied_as_head();
  }

  /// Applies a group of pushes as one update, the mean over its `contributions` (a worker's
  /// clock may span several requests, slices or servers' shares: it counts once); `round` is
  /// the round's clock, or a soft-sync group's number.
  void apply_group(Transport& t, std::vector<pending_push<T>>& group, std::size_t contributions, std::int64_t round) {
    if (group.empty()) return;
    const update_origin from{no_worker, static_cast<std::uint64_t>(round)};
    if (group.size() == 1 && contributions == 1) {
      const pending_push<T>& p = group.front();
      apply_single(t, from, p.worker, p.which, p.keys, p.values, p.length, p.basis);
      return;
    }
    double staleness = 0;
    for (const auto& p : group) {
      const std::uint64_t s = staleness_of(p.basis);
      staleness += static_cast<double>(s);
      stats_->record_staleness(p.worker, s);
    }
    const step_info info{static_cast<std::uint64_t>(staleness / static_cast<double>(group.size()) + 0.5), 1.0};
    // Gradients are averaged over the group; summation mode adds every push as it is.
    const T scale = sparse_.mode() == apply_mode::sum ? T(1) : T(1) / static_cast<T>(contributions);
    const auto means = mean_of(group, scale);
    for (std::size_t i = 0; i < means.size(); ++i) {
      const group_mean<T>& m = means[i];
      replication_.forward(t, m.which, m.keys, m.values, m.length, info.staleness, from, nullptr,
                           i + 1 == means.size());
      table_of(m.which).push(m.keys, m.values, m.length, info);
    }
    applied_as_head();
  }

  /// An update of the shard from its head, as this server's copy of it.
  void apply_copy(table_id which, std::span<const key_type> keys, std::span<const T> values, std::size_t length,
                  std::uint64_t staleness, bool last_of_version) {
    table_of(which).push(keys, values, length, {staleness, 1.0});
    version_ += last_of_version ? 1 : 0;
  }

 private:
  // One more update of the shard, applied by this server as its head (copies count theirs in
  // `apply_copy`, and not in the server's `head_updates`).
  void applied_as_head() noexcept {
    ++version_;
    ++stats_->head_updates;
  }

  table_type sparse_, dense_;
  shard_chain<Transport, T> replication_;
  server_stats* stats_;
  std::uint64_t version_ = 0;
};

}  // namespace dtrain::ps
