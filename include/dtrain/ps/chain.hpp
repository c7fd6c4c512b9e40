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

#include <cstddef>
#include <string>
#include <vector>

#include "dtrain/core/error.hpp"

namespace dtrain::ps {

/// The chains of `servers` shards with `replicas` copies each.
class chain_layout {
 public:
  /// @throws dtrain::error `invalid_argument` unless 1 <= replicas <= servers
  chain_layout(int servers, int replicas) : servers_(servers), replicas_(replicas) {
    if (servers < 1 || replicas < 1 || replicas > servers) {
      throw error(errc::invalid_argument, "ps: " + std::to_string(replicas) + " replicas of each shard on " +
                                              std::to_string(servers) +
                                              " servers; need 1 <= replicas <= servers (each copy on its own server)");
    }
  }

  int servers() const noexcept { return servers_; }
  int replicas() const noexcept { return replicas_; }

  /// The server at `position` (0 = head) in shard `shard`'s chain.
  int member(int shard, int position) const noexcept { return (shard + position) % servers_; }
  int head(int shard) const noexcept { return shard; }
  int tail(int shard) const noexcept { return member(shard, replicas_ - 1); }

  /// Where `server` stands in `shard`'s chain, or -1 if it holds no copy of it.
  int position(int shard, int server) const noexcept {
    const int p = (server - shard + servers_) % servers_;
    return p < replicas_ ? p : -1;
  }

  /// The server `server` passes `shard`'s updates to, or -1 if it is the tail (or not in the chain).
  int successor(int shard, int server) const noexcept {
    const int p = position(shard, server);
    return p < 0 || p == replicas_ - 1 ? -1 : member(shard, p + 1);
  }

  /// The server `server` receives `shard`'s updates from, or -1 if it is the head (or not in it).
  int predecessor(int shard, int server) const noexcept {
    const int p = position(shard, server);
    return p <= 0 ? -1 : member(shard, p - 1);
  }

  /// The shards `server` holds a copy of but does not head: whose heads it waits for at the end.
  std::vector<int> replicated_on(int server) const {
    std::vector<int> shards;
    for (int p = 1; p < replicas_; ++p) shards.push_back((server - p + servers_) % servers_);
    return shards;
  }

 private:
  int servers_;
  int replicas_;
};

}  // namespace dtrain::ps
