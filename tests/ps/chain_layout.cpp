// The layout of chain replication's chains: shard s on servers s, s+1, ..., s+k-1, each server
// heading one shard; lost servers leaving them, the next copy heading, joining servers as tails.
// Pure functions of the layout, checked against the rule written out here.

#include <vector>

#include "../catch.hpp"
#include "dtrain/ps/chain.hpp"
#include "dtrain/ps/shard_moves.hpp"

using namespace dtrain;
using namespace dtrain::ps;

TEST_CASE("chain layout: shard s lives on s, s+1, ..., s+k-1, each server heads one shard", "[ps][replication]") {
  const chain_layout c(4, 3);
  CHECK(c.head(1) == 1);
  CHECK(c.members(1)[1] == 2);
  CHECK(c.tail(1) == 3);
  CHECK(c.tail(3) == 1);  // wraps around
  CHECK(c.position(3, 0) == 1);
  CHECK(c.position(3, 2) == -1);  // not in shard 3's chain
  CHECK(c.successor(3, 3) == 0);
  CHECK(c.successor(3, 1) == -1);  // the tail
  CHECK(c.predecessor(3, 0) == 3);
  CHECK(c.predecessor(3, 3) == -1);  // the head
  CHECK(c.held_by(0) == std::vector<int>{0, 3, 2});
  // Every server holds exactly k shards, and heads one.
  for (int server = 0; server < 4; ++server) {
    int held = 0;
    for (int shard = 0; shard < 4; ++shard) held += c.position(shard, server) >= 0;
    CHECK(held == 3);
  }
  const chain_layout one(3, 1);
  CHECK(one.tail(2) == 2);
  CHECK(one.successor(2, 2) == -1);
  CHECK(one.held_by(1) == std::vector<int>{1});
  CHECK_THROWS_WITH(chain_layout(2, 3), Catch::Contains("3 replicas of each shard on 2 servers"));
  CHECK_THROWS_WITH(chain_layout(2, 0), Catch::Contains("need 1 <= replicas <= servers"));
}

TEST_CASE(
    "chain layout: with more shards than servers, server s heads s, s+S, s+2S, ... and holds the k-1 chains before "
    "each",
    "[ps][replication]") {
  chain_layout c(3, 2, 7);  // shards 0-6 on servers 0-2
  CHECK(c.shards() == 7);
  CHECK(c.chain(4) == std::vector<int>{1, 2});
  CHECK(c.chain(6) == std::vector<int>{0, 1});
  CHECK(c.chain(5) == std::vector<int>{2, 0});
  CHECK(c.held_by(0) == std::vector<int>{0, 3, 6, 2, 5});
  CHECK(c.held_by(2) == std::vector<int>{2, 5, 1, 4});
  // Every shard has k copies on distinct servers, and the heads differ by at most one shard.
  std::vector<int> heads(3, 0), copies(7, 0);
  for (int server = 0; server < 3; ++server) {
    for (int shard : c.held_by(server)) ++copies[static_cast<std::size_t>(shard)];
  }
  for (int shard = 0; shard < 7; ++shard) ++heads[static_cast<std::size_t>(c.head(shard))];
  CHECK(copies == std::vector<int>(7, 2));
  CHECK(heads == std::vector<int>{3, 2, 2});
  c.lose(1);
  CHECK(c.chain(4) == std::vector<int>{2});  // shard 4's head lost: its copy on 2 heads it
  CHECK(c.head(6) == 0);
  CHECK(chain_layout(3, 1).held_by(1) == chain_layout(3, 1, 3).held_by(1));
  CHECK_THROWS_WITH(chain_layout(3, 1, 2),
                    Catch::Contains("2 shards on 3 servers; need at least one shard per server"));
  CHECK_THROWS_WITH(roles::of(5, 3, 0, 0, 2),
                    Catch::Contains("each server heads at least one (DTRAIN_PS_SHARDS >= DTRAIN_PS_SERVERS)"));
}

TEST_CASE(
    "chain layout: a shard moves to a growing server, which joins its chain, and its first copy then leaves that chain "
    "only",
    "[ps][replication]") {
  // 3 servers, 1 growing standby (rank 5 in a group of 3 servers, 2 workers, 1 standby), 8
  // shards: the growing server takes the shards j with j mod 4 = 3.
  const roles r = roles::of(6, 3, 1, 0, 8, 1);
  CHECK(r.grows_into(3) == 5);
  CHECK(r.grows_into(7) == 5);
  for (int j : {0, 1, 2, 4, 5, 6}) CHECK(r.grows_into(j) == -1);
  CHECK_THROWS_WITH(roles::of(6, 3, 1, 0, 3, 1), Catch::Contains("needs a shard to take"));
  CHECK_THROWS_WITH(roles::of(6, 3, 0, 0, 8, 1), Catch::Contains("a growing server is a standby"));
  chain_layout c(3, 2, 8);  // shard 3: 0 -> 1
  CHECK_FALSE(moves_away(c, r, 0, 3));  // the growing server is not in the chain yet
  c.join(3, 5);
  CHECK(c.chain(3) == std::vector<int>{0, 1, 5});
  CHECK(moves_away(c, r, 0, 3));
  CHECK_FALSE(moves_away(c, r, 1, 3));  // only the first copy gives it up
  CHECK_FALSE(moves_away(c, r, 0, 0));  // shard 0 grows into nobody
  c.leave(3, 0);
  CHECK(c.chain(3) == std::vector<int>{1, 5});  // 1 heads it, 5 is its tail: still two copies
  CHECK(c.head(0) == 0);                        // server 0 still heads its other shards
  CHECK(c.held_by(0) == std::vector<int>{0, 6, 2, 5});
  CHECK(c.gone(3, 0));
  CHECK_FALSE(c.gone(0, 0));
  CHECK(c.successor(3, 1) == 5);
  CHECK_FALSE(moves_away(c, r, 1, 3));  // once moved, the shard stays
  // With a copy lost, the first copy keeps the shard: it would be left with fewer than k.
  chain_layout lossy(3, 2, 8);
  lossy.join(7, 5);  // shard 7: 1 -> 2 -> 5
  lossy.lose(2);
  CHECK_FALSE(moves_away(lossy, r, 1, 7));
  // Workers asking server 0 for shard 3 now are told where it went.
  response_header h{op::push, 0, 42, 0, 0, 0, 0};
  h.shard = 3;
  const message m = moved_reply(c, r, h);
  const response_header back = decode_response(m.bytes(), 0);
  CHECK(back.status == shard_moved);
  CHECK(back.joined[0] == 5 + 1);
  CHECK(back.id == 42);
  CHECK(std::string(reinterpret_cast<const char*>(m.bytes().data()) + header_bytes, m.bytes().size() - header_bytes) ==
        "shard 3 moved to server 5");
}

TEST_CASE("chain layout: lost servers leave the chains, the next copy heads, the one before tails",
          "[ps][replication]") {
  chain_layout c(4, 3);  // shard 0: 0 1 2, shard 1: 1 2 3, shard 2: 2 3 0, shard 3: 3 0 1
  c.lose(2);
  CHECK(c.chain(0) == std::vector<int>{0, 1});     // the tail was lost: 1 tails
  CHECK(c.chain(1) == std::vector<int>{1, 3});     // the middle: 1 passes to 3
  CHECK(c.chain(2) == std::vector<int>{3, 0});     // the head: 3 heads
  CHECK(c.head(2) == 3);
  CHECK(c.tail(0) == 1);
  CHECK(c.successor(1, 1) == 3);
  CHECK(c.predecessor(1, 3) == 1);
  CHECK(c.successor(0, 1) == -1);
  CHECK(c.predecessor(2, 3) == -1);  // the head now
  CHECK(c.position(2, 2) == 0);       // static positions do not move
  c.lose(3);
  CHECK(c.chain(2) == std::vector<int>{0});
  CHECK(c.head(2) == 0);
  CHECK(c.tail(2) == 0);
  c.lose(0);
  CHECK(c.chain(2).empty());  // every copy lost
  CHECK(c.head(2) == -1);
  CHECK(c.tail(2) == -1);
  CHECK(c.chain(0) == std::vector<int>{1});
}

TEST_CASE("chain layout: a server that joins a chain is its new tail, and heads it once the copies before are lost",
          "[ps][replication]") {
  chain_layout c(3, 2);  // shard 0: 0 1, shard 1: 1 2, shard 2: 2 0; rank 7 a standby
  c.lose(0);
  CHECK(c.held_by(0) == std::vector<int>{0, 2});  // what a standby taking its place joins
  c.join(0, 7);
  c.join(2, 7);
  c.join(2, 7);  // joining twice is joining once
  CHECK(c.joined(2) == std::vector<int>{7});
  CHECK(c.chain(0) == std::vector<int>{1, 7});
  CHECK(c.chain(2) == std::vector<int>{2, 7});
  CHECK(c.tail(0) == 7);
  CHECK(c.successor(0, 1) == 7);
  CHECK(c.predecessor(0, 7) == 1);
  CHECK(c.position(0, 7) == 2);  // after the static members, lost or not
  CHECK(c.held_by(7) == std::vector<int>{0, 2});
  CHECK(c.held_by(1) == std::vector<int>{1, 0});
  c.lose(1);
  CHECK(c.head(0) == 7);
  CHECK(c.predecessor(0, 7) == -1);
  CHECK(c.chain(1) == std::vector<int>{2});
  c.lose(7);
  CHECK(c.chain(0).empty());
}
