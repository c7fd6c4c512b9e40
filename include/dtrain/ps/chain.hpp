#pragma once
/// @file
/// `ps::chain_layout`: where the replicas of each key range live under chain replication (van
/// Renesse and Schneider, OSDI 2004; the Parameter Server paper, OSDI 2014, section 4.3).
///
/// Shard j (the j-th key range of `range_sharding`, or of the dense layout) is held by the k
/// servers j, j+1, ..., j+k-1 (mod S), in that order: the first is the chain's head, which takes
/// the workers' requests and applies them; each server passes what it applied on to the next; the
/// last, the tail, acknowledges to the head. k = 1 is a chain of one: the head is its own tail.
/// With one shard per server (the default) every server heads one shard and holds k-1 others;
/// with J > S shards server s heads shards s, s+S, s+2S, ..., so the load stays even when S
/// divides J.
///
/// A server that joins a shard (a standby taking a lost server's place, ps/server.hpp) is added
/// after the chain's static members, as its new tail, as chain replication adds servers. A
/// server that gives up its copy of one shard (the shard moved to a server added to the job)
/// leaves that chain only: the chain closes over it as over a lost server.

#include <algorithm>
#include <cstddef>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/core/error.hpp"

namespace dtrain::ps {

/// The chains of the shards with `replicas` copies each on `servers` servers, the servers that joined them,
/// and which servers are lost. Servers are named by rank. A chain is its members (static, then
/// joined) minus the lost ones, in order: when a head dies the next copy heads the shard, when a
/// tail dies the one before it is the tail. Every process computes the same chains from the same
/// lost and joined sets (a pure function of them), so no one elects anyone.
class chain_layout {
 public:
  /// @param shards key ranges (0: one per server)
  /// @throws dtrain::error `invalid_argument` unless 1 <= replicas <= servers <= shards
  chain_layout(int servers, int replicas, int shards = 0)
      : servers_(servers), replicas_(replicas), shards_(shards == 0 ? servers : shards) {
    if (servers < 1 || replicas < 1 || replicas > servers) {
      throw error(errc::invalid_argument, "ps: " + std::to_string(replicas) + " replicas of each shard on " +
                                              std::to_string(servers) +
                                              " servers; need 1 <= replicas <= servers (each copy on its own server)");
    }
    if (shards_ < servers) {
      throw error(errc::invalid_argument, "ps: " + std::to_string(shards_) + " shards on " + std::to_string(servers) +
                                              " servers; need at least one shard per server");
    }
  }

  int servers() const noexcept { return servers_; }
  int replicas() const noexcept { return replicas_; }
  int shards() const noexcept { return shards_; }

  /// Server `server` is gone: the chains close over it.
  void lose(int server) { lost_.insert(server); }
  bool lost(int server) const noexcept { return lost_.count(server) != 0; }

  /// Server `server` gives up its copy of `shard`: that chain closes over it.
  void leave(int shard, int server) { left_.insert({shard, server}); }
  /// Whether `server` gave up its copy of `shard`.
  bool left(int shard, int server) const noexcept { return left_.count({shard, server}) != 0; }
  /// Whether `server` is out of `shard`'s chain: lost, or left it.
  bool gone(int shard, int server) const noexcept { return lost(server) || left(shard, server); }

  /// Server `server` joins `shard`'s chain as its tail (no-op if it is a member already).
  void join(int shard, int server) {
    if (position(shard, server) < 0) joined_[shard].push_back(server);
  }
  /// The servers that joined `shard`'s chain, in the order they joined.
  std::vector<int> joined(int shard) const {
    const auto it = joined_.find(shard);
    return it == joined_.end() ? std::vector<int>{} : it->second;
  }

  bool has_joined(int shard) const { return joined_.find(shard) != joined_.end(); }

  /// The members of `shard`'s chain, lost (or left) or not: static ones first, then those that joined.
  std::vector<int> members(int shard) const {
    std::vector<int> m;
    for (int p = 0; p < replicas_; ++p) m.push_back((shard + p) % servers_);
    if (const auto it = joined_.find(shard); it != joined_.end())
      m.insert(m.end(), it->second.begin(), it->second.end());
    return m;
  }

  /// The live members of `shard`'s chain, head first (empty: every copy is lost).
  std::vector<int> chain(int shard) const {
    std::vector<int> c;
    for (int s : members(shard)) {
      if (!gone(shard, s)) c.push_back(s);
    }
    return c;
  }

  /// The first live member of `shard`'s chain, or -1 if every copy is lost.
  int head(int shard) const {
    const auto c = chain(shard);
    return c.empty() ? -1 : c.front();
  }
  /// The last live member, or -1.
  int tail(int shard) const {
    const auto c = chain(shard);
    return c.empty() ? -1 : c.back();
  }

  /// Where `server` stands among `shard`'s members (0 = static head), or -1 if it holds no copy.
  int position(int shard, int server) const {
    const auto m = members(shard);
    const auto it = std::find(m.begin(), m.end(), server);
    return it == m.end() ? -1 : static_cast<int>(it - m.begin());
  }

  /// The live server `server` passes `shard`'s updates to, or -1 if it is the tail (or not in
  /// the chain).
  int successor(int shard, int server) const { return neighbour(shard, server, +1); }

  /// The live server `server` receives `shard`'s updates from, or -1 if it is the head.
  int predecessor(int shard, int server) const { return neighbour(shard, server, -1); }

  /// The shards `server` holds a copy of: for a static server those it heads first, then those
  /// it is the p-th copy of (p = 1, ..., k-1); then those it joined; less those it left.
  std::vector<int> held_by(int server) const {
    std::vector<int> shards;
    if (server >= 0 && server < servers_) {
      for (int p = 0; p < replicas_; ++p) {
        for (int j = (server - p + servers_) % servers_; j < shards_; j += servers_) shards.push_back(j);
      }
    }
    for (const auto& [shard, joined] : joined_) {
      if (std::find(joined.begin(), joined.end(), server) != joined.end()) shards.push_back(shard);
    }
    std::erase_if(shards, [&](int j) { return left(j, server); });
    return shards;
  }

 private:
  // The first live member beside `server` in `shard`'s chain, stepping by `step`; -1 if none.
  int neighbour(int shard, int server, int step) const {
    const auto m = members(shard);
    const auto it = std::find(m.begin(), m.end(), server);
    if (it == m.end()) return -1;
    for (auto p = static_cast<std::ptrdiff_t>(it - m.begin()) + step;
         p >= 0 && p < static_cast<std::ptrdiff_t>(m.size()); p += step) {
      if (!gone(shard, m[static_cast<std::size_t>(p)])) return m[static_cast<std::size_t>(p)];
    }
    return -1;
  }

  int servers_;
  int replicas_;
  int shards_;
  std::set<int> lost_;
  std::set<std::pair<int, int>> left_;  // (shard, server)
  std::map<int, std::vector<int>> joined_;
};

}  // namespace dtrain::ps
