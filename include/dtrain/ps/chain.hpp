#pragma once
/// @file
/// `ps::chain_layout`: where the replicas of each key range live under chain replication (van
/// Renesse and Schneider, OSDI 2004; the Parameter Server paper, OSDI 2014, section 4.3).
///
/// Shard s (the key range that `range_sharding` or the dense layout gives server s) is held by
/// the k servers s, s+1, ..., s+k-1 (mod S), in that order: s is the chain's head, which takes the
/// workers' requests and applies them; each server passes what it applied on to the next; the
/// last, the tail, acknowledges to the head. So every server heads one shard and holds k-1 others,
/// and the load stays even. k = 1 is a chain of one: the head is its own tail.

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "dtrain/core/error.hpp"

namespace dtrain::ps {

/// The chains of `servers` shards with `replicas` copies each, and which servers are lost.
/// A chain is its static members minus the lost ones, in order: when a head dies the next copy
/// heads the shard, when a tail dies the one before it is the tail. Every process computes the
/// same chains from the same lost set (a pure function of it), so no one elects anyone.
class chain_layout {
 public:
  /// @throws dtrain::error `invalid_argument` unless 1 <= replicas <= servers
  chain_layout(int servers, int replicas)
      : servers_(servers), replicas_(replicas), lost_(static_cast<std::size_t>(std::max(servers, 0)), false) {
    if (servers < 1 || replicas < 1 || replicas > servers) {
      throw error(errc::invalid_argument, "ps: " + std::to_string(replicas) + " replicas of each shard on " +
                                              std::to_string(servers) +
                                              " servers; need 1 <= replicas <= servers (each copy on its own server)");
    }
  }

  int servers() const noexcept { return servers_; }
  int replicas() const noexcept { return replicas_; }

  /// Server `server` is gone: the chains close over it.
  void lose(int server) { lost_.at(static_cast<std::size_t>(server)) = true; }
  bool lost(int server) const noexcept { return lost_[static_cast<std::size_t>(server)]; }

  /// The server at static `position` (0 = head) in shard `shard`'s chain, lost or not.
  int member(int shard, int position) const noexcept { return (shard + position) % servers_; }

  /// The live members of `shard`'s chain, head first (empty: every copy is lost).
  std::vector<int> chain(int shard) const {
    std::vector<int> c;
    for (int p = 0; p < replicas_; ++p) {
      if (!lost(member(shard, p))) c.push_back(member(shard, p));
    }
    return c;
  }

  /// The first live member of `shard`'s chain, or -1 if every copy is lost.
  int head(int shard) const noexcept { return next_live(shard, 0, +1); }
  /// The last live member, or -1.
  int tail(int shard) const noexcept { return next_live(shard, replicas_ - 1, -1); }

  /// Where `server` stands in `shard`'s static chain, or -1 if it holds no copy of it.
  int position(int shard, int server) const noexcept {
    const int p = (server - shard + servers_) % servers_;
    return p < replicas_ ? p : -1;
  }

  /// The live server `server` passes `shard`'s updates to, or -1 if it is the tail (or not in
  /// the chain).
  int successor(int shard, int server) const noexcept {
    const int p = position(shard, server);
    return p < 0 ? -1 : next_live(shard, p + 1, +1);
  }

  /// The live server `server` receives `shard`'s updates from, or -1 if it is the head.
  int predecessor(int shard, int server) const noexcept {
    const int p = position(shard, server);
    return p <= 0 ? -1 : next_live(shard, p - 1, -1);
  }

  /// The shards `server` holds a copy of, its own first: its own and the k-1 before it.
  std::vector<int> held_by(int server) const {
    std::vector<int> shards;
    for (int p = 0; p < replicas_; ++p) shards.push_back((server - p + servers_) % servers_);
    return shards;
  }

 private:
  // The first live member from static position `p` on, stepping by `step`; -1 if none.
  int next_live(int shard, int p, int step) const noexcept {
    for (; p >= 0 && p < replicas_; p += step) {
      if (!lost(member(shard, p))) return member(shard, p);
    }
    return -1;
  }

  int servers_;
  int replicas_;
  std::vector<bool> lost_;
};

}  // namespace dtrain::ps
