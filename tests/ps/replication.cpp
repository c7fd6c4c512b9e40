// Chain replication, with servers and workers as threads of one process: every copy of a key
// equal bit for bit to its head's, updater state included; BSP results unchanged by the number
// of copies; replies held for the tail; messages that do not fit the chains refused, naming the
// sender. The chains' layout is tested in chain_layout.cpp.

#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "../catch.hpp"
#include "dtrain/consistency/policies.hpp"
#include "dtrain/ps/chain.hpp"
#include "dtrain/ps/server.hpp"
#include "dtrain/ps/shard_moves.hpp"
#include "dtrain/ps/worker.hpp"
#include "dtrain/transport/inproc.hpp"
#include "dtrain/updater/momentum.hpp"

using namespace dtrain;
using namespace dtrain::ps;
using namespace std::chrono_literals;

namespace {

// Every key a server holds: its values, then its updater state, as raw bits.
using snapshot = std::map<key_type, std::vector<std::uint32_t>>;

template <class Table>
snapshot snapshot_of(Table& t) {
  snapshot s;
  t.for_each([&](key_type key, std::span<float> values, std::span<float> state) {
    auto& bits = s[key];
    bits.resize(values.size() + state.size());
    std::memcpy(bits.data(), values.data(), values.size_bytes());
    std::memcpy(bits.data() + values.size(), state.data(), state.size_bytes());
  });
  return s;
}

struct server_view {
  snapshot sparse, dense;
  replication_stats replication;
  std::uint64_t version = 0;         // its own shard's
  std::uint64_t head_updates = 0;    // those it applied as a head, to any shard
  std::map<int, std::uint64_t> shard_versions;  // of every shard it holds
};

ps_options replicated(int replicas) {
  ps_options o;
  o.timeout = 20s;
  o.heartbeat_interval = 50ms;
  o.heartbeat_timeout = 5s;
  o.replicas = replicas;
  o.dense_slice_bytes = 256;  // a dense tensor of 1000 floats is 16 slices, over every server
  return o;
}

// `workers` workers train `clocks` clocks on sparse keys of every shard and a dense tensor,
// through momentum (an updater with state), pulling and pushing separately or fused.
template <class Consistency>
std::vector<server_view> train(int servers, int workers, int replicas, int clocks, bool fused, int shards = 0) {
  std::vector<server_view> views(static_cast<std::size_t>(servers));
  const roles r = roles::of(servers + workers, servers, 0, 0, shards);
  const ps_options o = replicated(replicas);
  constexpr key_type key_space = 1 << 20;
  run_inproc(servers + workers, [&](int rank, inproc_transport t) {
    if (r.is_server(rank)) {
      server<inproc_transport, Consistency, float, momentum<float>> s(std::move(t), r, Consistency{},
                                                                      momentum<float>(0.05, 0.9), {}, o);
      s.run();
      auto& v = views[static_cast<std::size_t>(rank)];
      v = {{}, {}, s.replication(), s.stats().version, s.stats().head_updates, {}};
      for (int held : s.held_shards()) {  // its own shard and its copies of others
        v.shard_versions[held] = s.version_of(held);
        v.sparse.merge(snapshot_of(s.shard_tables(held).sparse()));
        v.dense.merge(snapshot_of(s.shard_tables(held).dense()));
      }
      return;
    }
    worker<inproc_transport, Consistency, float> w(std::move(t), r, range_sharding(r.shard_count(), key_space), o);
    std::vector<key_type> keys;
    for (key_type k = 0; k < 60; ++k) keys.push_back(k * (key_space / 60) + 7);
    const std::size_t dense = w.add_dense(1000);
    std::vector<float> weights(keys.size()), grads(keys.size()), dense_weights(1000), dense_grads(1000);
    for (int c = 0; c < clocks; ++c) {
      for (std::size_t i = 0; i < keys.size(); ++i)
        grads[i] = 0.5f * weights[i] - 0.01f * float((keys[i] + c) % 13) + 0.001f * float(w.id());
      for (std::size_t i = 0; i < dense_grads.size(); ++i)
        dense_grads[i] = 0.3f * dense_weights[i] + 0.002f * float((i + c) % 17);
      if (fused) {
        auto a = w.push_pull(keys, std::span<const float>(grads), std::span(weights), 1);
        auto b = w.push_pull_dense(dense, std::span<const float>(dense_grads), std::span(dense_weights));
        w.wait(a);
        w.wait(b);
      } else {
        auto a = w.push(keys, std::span<const float>(grads), 1);
        auto b = w.push_dense(dense, std::span<const float>(dense_grads));
        w.wait(a);
        w.wait(b);
      }
      auto ticked = w.clock();
      w.wait(ticked);
      if (!fused) {
        auto a = w.pull(keys, std::span(weights), 1);
        auto b = w.pull_dense(dense, std::span(dense_weights));
        w.wait(a);
        w.wait(b);
      }
    }
    w.finish();
  });
  return views;
}

// Every key held by exactly `replicas` servers, each copy equal to the others bit for bit.
// @returns the keys' one value, over all servers
snapshot check_copies(const std::vector<server_view>& views, int replicas, bool dense) {
  std::map<key_type, int> copies;
  snapshot all;
  for (const auto& v : views) {
    for (const auto& [key, bits] : dense ? v.dense : v.sparse) {
      ++copies[key];
      auto [it, fresh] = all.try_emplace(key, bits);
      INFO("key " << key);
      CHECK(it->second == bits);
    }
  }
  for (const auto& [key, n] : copies) {
    INFO("key " << key);
    CHECK(n == replicas);
  }
  return all;
}

void check_traffic(const std::vector<server_view>& views, int replicas) {
  std::uint64_t forwarded = 0, applied = 0, relayed = 0, held = 0;
  for (const auto& v : views) {
    forwarded += v.replication.forwarded;
    applied += v.replication.applied;
    relayed += v.replication.relayed;
    held += v.replication.held_replies;
  }
  CHECK(applied == forwarded * static_cast<std::uint64_t>(replicas - 1));
  CHECK(relayed == forwarded * static_cast<std::uint64_t>(std::max(replicas - 2, 0)));
  if (replicas > 1) {
    CHECK(forwarded > 0);
    CHECK(held > 0);  // replies did wait for the tail
  } else {
    CHECK(forwarded == 0);
  }
}

}  // namespace

TEST_CASE("replication under BSP: every copy equals its head, and the result does not depend on k",
          "[ps][replication]") {
  const bool fused = GENERATE(false, true);
  constexpr int servers = 3, workers = 2, clocks = 6;
  const auto one = train<bsp>(servers, workers, 1, clocks, fused);
  const snapshot sparse = check_copies(one, 1, false), dense = check_copies(one, 1, true);
  REQUIRE(sparse.size() == 60);
  REQUIRE(dense.size() == 16);
  for (int k : {2, 3}) {
    INFO(k << " replicas, fused " << fused);
    const auto views = train<bsp>(servers, workers, k, clocks, fused);
    CHECK(check_copies(views, k, false) == sparse);
    CHECK(check_copies(views, k, true) == dense);
    check_traffic(views, k);
    // Aggregation before replication: a round goes down the chain as at most three updates
    // (sparse keys, dense slices of 64 values, the last slice of 40), not one per worker's push.
    for (std::size_t s = 0; s < views.size(); ++s) {
      CHECK(views[s].replication.forwarded <= 3 * static_cast<std::uint64_t>(clocks));
      CHECK(views[s].version == one[s].version);
    }
  }
}

TEST_CASE("more shards than servers: the keys cut finer give the same BSP result, with every shard's k copies equal",
          "[ps][replication]") {
  constexpr int servers = 3, workers = 2, clocks = 6;
  const auto one = train<bsp>(servers, workers, 1, clocks, true);
  const snapshot sparse = check_copies(one, 1, false), dense = check_copies(one, 1, true);
  for (int k : {1, 2}) {
    INFO(k << " replicas");
    const auto views = train<bsp>(servers, workers, k, clocks, true, 7);
    CHECK(check_copies(views, k, false) == sparse);
    CHECK(check_copies(views, k, true) == dense);
    check_traffic(views, k);
    for (const auto& v : views) CHECK(v.version > 0);  // every server heads a shard that saw updates
    // Server s heads shards s, s + 3 and s + 6: the updates it applied as a head are theirs, not
    // its own shard's alone, and its copies of other shards add none.
    std::map<int, std::uint64_t> version;
    for (const auto& v : views) version.insert(v.shard_versions.begin(), v.shard_versions.end());
    REQUIRE(version.size() == 7);
    for (int s = 0; s < servers; ++s) {
      std::uint64_t want = 0;
      for (int shard = s; shard < 7; shard += servers) want += version[shard];
      CHECK(views[static_cast<std::size_t>(s)].head_updates == want);
      CHECK(views[static_cast<std::size_t>(s)].head_updates > views[static_cast<std::size_t>(s)].version);
    }
  }
}

TEST_CASE("replication under ASP: pushes applied on arrival reach every copy, in the head's order",
          "[ps][replication]") {
  const bool fused = GENERATE(false, true);
  const auto views = train<asp>(3, 3, 3, 8, fused);
  check_copies(views, 3, false);
  check_copies(views, 3, true);
  check_traffic(views, 3);
  // One worker: the same pushes in the same order as one copy.
  const auto single = train<asp>(2, 1, 1, 8, fused), twice = train<asp>(2, 1, 2, 8, fused);
  CHECK(check_copies(twice, 2, false) == check_copies(single, 1, false));
  CHECK(check_copies(twice, 2, true) == check_copies(single, 1, true));
}

namespace {

// Server 0 of 3 (2 replicas) gets `bogus` from rank 2, which runs no server: what server 0 says.
std::string server0_refuses(request_header bogus) {
  const roles r = roles::of(4, 3);
  ps_options o = replicated(2);
  o.timeout = 2s;
  o.heartbeat_timeout = 2s;
  std::string refusal;
  run_inproc(4, [&](int rank, inproc_transport t) {
    try {
      if (rank == 2) {
        const message m =
            encode_request<float>(bogus, std::vector<key_type>(bogus.keys, 1), std::vector<float>(bogus.keys, 1.0f));
        t.isend(0, o.tag, signature{}, m.bytes()).wait(deadline::after(o.timeout));
      } else if (r.is_server(rank)) {
        server<inproc_transport, asp, float, momentum<float>> s(std::move(t), r, asp{}, momentum<float>(), {}, o);
        s.run();
        if (rank == 0) refusal = "(server 0 ran to the end)";
      } else {
        worker<inproc_transport, asp, float> w(std::move(t), r, range_sharding(3), o);  // server 2 never answers
      }
    } catch (const dtrain::error& e) {
      if (rank == 0) refusal = e.what();
    }
  });
  return refusal;
}

}  // namespace

TEST_CASE("replication: an update out of its chain, or after a lost one, stops the server naming the sender",
          "[ps][replication]") {
  // Shard 1's chain is servers 1, 2: server 0 holds no copy of it.
  auto of_shard = [](request_header h, std::uint32_t shard) {
    h.shard = shard;
    return h;
  };
  CHECK_THAT(server0_refuses(of_shard({op::replicate, table_id::sparse, 1, 0, 0, 1, 1, 0}, 1)),
             Catch::Contains("server 2 sent a replicate of shard 1, which this server holds no copy of"));
  // Shard 2's chain is servers 2, 0: the first update is number 1.
  CHECK_THAT(server0_refuses(of_shard({op::replicate, table_id::sparse, 2, 0, 0, 1, 1, 0}, 2)),
             Catch::Contains("server 2 sent update 2 of shard 2 after 0: one was lost"));
  // Shard 0's chain is servers 0, 1: only server 1 acknowledges its updates.
  CHECK_THAT(server0_refuses(of_shard({op::replicated, table_id::sparse, 1, 0, 0, 0, 0, 0}, 0)),
             Catch::Contains("server 2 sent a replicated of shard 0 out of its chain"));
}

TEST_CASE("replication: a worker started with another replica count is refused, naming both", "[ps][replication]") {
  const roles r = roles::of(3, 2);
  std::string refused;
  std::vector<std::string> stopped(2, "(ran to the end)");  // what each server's run() threw
  run_inproc(3, [&](int rank, inproc_transport t) {
    ps_options o = replicated(2);
    o.timeout = 2s;
    if (r.is_server(rank)) {
      server<inproc_transport, bsp, float, momentum<float>> s(std::move(t), r, bsp{}, momentum<float>(), {}, o);
      try {
        s.run();
      } catch (const std::exception& e) {
        stopped[static_cast<std::size_t>(rank)] = e.what();
      }
      return;
    }
    o.replicas = 1;
    try {
      worker<inproc_transport, bsp, float> w(std::move(t), r, range_sharding(2), o);
    } catch (const dtrain::error& e) {
      refused = e.what();
    }
  });
  for (const auto& s : stopped) CHECK_THAT(s, Catch::Contains("never said hello"));
  CHECK_THAT(
      refused,
      Catch::Contains("configured differently from server 0 (2 servers, 1 workers, bsp, 4-byte values, 2 replicas)"));
}

TEST_CASE("replication: a tail that never acknowledges fails the head, which refuses what it held, naming the tail",
          "[ps][replication]") {
  // Rank 1 stands in for server 1, the tail of shard 0: it answers the worker like a server but
  // never acknowledges an update. The reply the head held for the worker's push_pull becomes the
  // head's refusal.
  const roles r = roles::of(3, 2);
  ps_options o = replicated(2);
  o.timeout = 1s;
  std::string head_failure, worker_failure;
  run_inproc(3, [&](int rank, inproc_transport t) {
    if (rank == 0) {
      server<inproc_transport, asp, float, momentum<float>> s(std::move(t), r, asp{}, momentum<float>(), {}, o);
      try {
        s.run();
      } catch (const dtrain::error& e) {
        head_failure = e.what();
      }
    } else if (rank == 1) {
      for (bool done = false; !done;) {  // answers hello and goodbye, ignores the chain
        std::vector<std::byte> in;
        auto got = t.irecv(any_peer, o.tag, in);
        std::error_code ec;
        if (!got.wait(deadline::after(5s), ec)) return;
        const auto h = decode_request<float>(in, got.info().peer).header;
        if (h.what != op::hello && h.what != op::goodbye) continue;
        done = h.what == op::goodbye;
        const message reply = encode_response<float>({h.what, 0, h.id, 0, 0, 0, 1}, {});
        t.isend(got.info().peer, reply_tag(o.tag, h.id), signature{}, reply.bytes()).wait(deadline::after(5s));
      }
    } else {
      ps_options patient = o;  // waits longer than the head
      patient.timeout = 5s;
      worker<inproc_transport, asp, float> w(std::move(t), r, range_sharding(2, 1 << 20), patient);
      const std::vector<key_type> keys{1, 2, 3};  // shard 0
      std::vector<float> grads(3, 1.0f), out(3);
      auto q = w.push_pull(keys, std::span<const float>(grads), std::span(out), 1);
      try {
        w.wait(q);
      } catch (const dtrain::error& e) {
        worker_failure = e.what();
      }
    }
  });
  CHECK_THAT(head_failure,
             Catch::Contains("server 1, the tail of shard 0, has not acknowledged update 1 within 1000 ms"));
  CHECK_THAT(worker_failure, Catch::Contains("server 0 refused a push_pull"));
  CHECK_THAT(worker_failure, Catch::Contains("the tail of shard 0, has not acknowledged"));
}
