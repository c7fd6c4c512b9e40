#pragma once
/// @file
/// `ps::push_rounds<T>`: the pushes a server holds back because its consistency model applies
/// them together, and the mean each group makes.
///  - Barrier models (`bsp`): the pushes of clock c wait in round c until every live worker has
///    finished c; then the round is one group, with one contribution per worker in it.
///  - Soft synchronisation (`soft_sync<s>`): a worker's pushes of one clock form one contribution
///    when that clock ends; the server applies the group once it holds s contributions.
/// The server decides when; this file keeps the pushes and computes the mean, in worker order,
/// so the result is the same whatever order the pushes arrived in.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/concepts/sharding.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/ps/protocol.hpp"

namespace dtrain::ps {

/// One push held until its group is applied.
template <class T>
struct pending_push {
  std::uint32_t worker;
  std::uint64_t id;          ///< the request's
  table_id which;
  std::uint32_t length;      ///< values per key
  std::uint64_t basis;       ///< the version the worker computed it from
  std::vector<key_type> keys;
  std::vector<T> values;
};

/// What a group of pushes adds to one table: its keys of one value length and their values.
template <class T>
struct group_mean {
  table_id which;
  std::size_t length;
  std::vector<key_type> keys;
  std::vector<T> values;
};

/// Each key's pushes in `group`, summed in worker order and multiplied by `scale`, as one
/// `group_mean` per table and value length (keys ascending).
/// @throws dtrain::error `invalid_argument` if a key was pushed with two lengths.
template <class T>
std::vector<group_mean<T>> mean_of(std::vector<pending_push<T>>& group, T scale) {
  std::stable_sort(group.begin(), group.end(), [](const auto& a, const auto& b) { return a.worker < b.worker; });
  std::vector<group_mean<T>> means;
  for (table_id which : {table_id::sparse, table_id::dense}) {
    std::map<key_type, std::vector<T>> sums;
    for (const auto& p : group) {
      if (p.which != which) continue;
      for (std::size_t i = 0; i < p.keys.size(); ++i) {
        auto& acc = sums[p.keys[i]];
        if (acc.empty()) acc.assign(p.length, T(0));
        if (acc.size() != p.length) {
          throw error(errc::invalid_argument, "key " + std::to_string(p.keys[i]) + " pushed with lengths " +
                                                  std::to_string(acc.size()) + " and " + std::to_string(p.length));
        }
        for (std::size_t j = 0; j < p.length; ++j) acc[j] += p.values[i * p.length + j];
      }
    }
    // Keys of one length go to the table in one push.
    std::map<std::size_t, group_mean<T>> by_length;
    for (auto& [key, acc] : sums) {
      auto [it, fresh] = by_length.try_emplace(acc.size(), group_mean<T>{which, acc.size(), {}, {}});
      it->second.keys.push_back(key);
      for (T v : acc) it->second.values.push_back(v * scale);
    }
    for (auto& [length, mean] : by_length) means.push_back(std::move(mean));
  }
  return means;
}

/// The pushes held back, by barrier round and by soft-sync contribution.
template <class T>
class push_rounds {
 public:
  using group = std::vector<pending_push<T>>;

  /// Under a barrier model: `p` waits for every worker to finish `clock`.
  void hold_for_round(std::int64_t clock, pending_push<T> p) { by_clock_[clock].push_back(std::move(p)); }

  /// Under soft sync: `p` joins its worker's contribution for the clock it is in.
  void hold_for_contribution(pending_push<T> p) { open_[p.worker].push_back(std::move(p)); }

  /// Worker `w` finished a clock (or left): its pushes of that clock become one contribution.
  void close_contribution(std::uint32_t w) {
    auto it = open_.find(w);
    if (it == open_.end() || it->second.empty()) return;
    for (auto& p : it->second) group_.push_back(std::move(p));
    it->second.clear();
    ++contributions_;
  }

  /// Whether worker `w`'s request `id` is held (a push sent again after a fail-over).
  bool holds(std::uint32_t w, std::uint64_t id) const {
    auto held = [&](const group& g) {
      return std::any_of(g.begin(), g.end(), [&](const pending_push<T>& p) { return p.worker == w && p.id == id; });
    };
    return held(group_) ||
           std::any_of(by_clock_.begin(), by_clock_.end(), [&](const auto& r) { return held(r.second); });
  }

  /// Calls `apply(group, workers, clock)` for every round before `slowest` (the clock every
  /// live worker has reached), oldest first, `workers` being how many workers pushed in it.
  template <class Apply>
  void complete_rounds(std::int64_t slowest, Apply&& apply) {
    while (!by_clock_.empty() && by_clock_.begin()->first < slowest) {
      group& round = by_clock_.begin()->second;
      std::vector<std::uint32_t> workers;
      for (const auto& p : round) workers.push_back(p.worker);
      std::sort(workers.begin(), workers.end());
      apply(round, static_cast<std::size_t>(std::unique(workers.begin(), workers.end()) - workers.begin()),
            by_clock_.begin()->first);
      by_clock_.erase(by_clock_.begin());
    }
  }

  /// Calls `apply(group, contributions, number)` if the soft-sync group holds at least `needed`
  /// contributions (or any, when `needed` is 0: no worker is left to add one), and empties it.
  template <class Apply>
  void complete_group(std::size_t needed, Apply&& apply) {
    if (contributions_ == 0 || (needed > 0 && contributions_ < needed)) return;
    apply(group_, contributions_, groups_++);
    group_.clear();
    contributions_ = 0;
  }

 private:
  std::map<std::int64_t, group> by_clock_;
  group group_;  // soft sync: the contributions so far
  std::size_t contributions_ = 0;
  std::int64_t groups_ = 0;  // soft-sync groups applied
  std::map<std::uint32_t, group> open_;  // soft sync: each worker's pushes of its current clock
};

}  // namespace dtrain::ps
