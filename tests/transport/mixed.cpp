// mixed_transport with ranks as threads of this process, each given a host identity, so one
// process holds several emulated hosts: shared memory inside each, TCP between them. Every peer
// is reached by its path, envelopes name world ranks, receives from any peer take each message
// exactly once whichever path it came by, and collectives match the serial reference.

#include <algorithm>
#include <atomic>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>

#include "../catch.hpp"
#include "../support/thread_checks.hpp"
#include "../support/thread_ranks.hpp"
#include "dtrain/collective/communicator.hpp"
#include "dtrain/transport/mixed.hpp"

using namespace dtrain;
using namespace std::chrono_literals;

static_assert(transport<mixed_transport>);

namespace {

const std::string token = "test-token";

// Runs body(rank, transport) with rank r on host hosts[r], each rank a thread.
template <class Body>
void run_mixed(const std::vector<std::string>& hosts, Body body, peer_path path = peer_path::automatic) {
  const int n = static_cast<int>(hosts.size());
  auto connect = [&](tcp_store& store, int r) {
    mixed_options o;
    o.tcp.token = o.shm.token = token;
    o.tcp.timeout = o.shm.timeout = 20s;
    o.shm.ring_bytes = 64 << 10;
    o.shm.single_copy_bytes = 64 << 10;
    o.host_id = hosts[static_cast<std::size_t>(r)];
    o.path = path;
    return mixed_transport::connect(store, r, n, o, "127.0.0.1");
  };
  testing::run_thread_ranks(n, token, connect, body);
}

using testing::bytes_of;

}  // namespace

TEST_CASE("mixed: every peer is reached by its path and envelopes name world ranks", "[mixed]") {
  const std::vector<std::string> hosts{"a", "a", "b", "b", "a"};
  run_mixed(hosts, [&](int r, mixed_transport& t) {
    const int n = t.size();
    for (int p = 0; p < n; ++p) {
      TCHECK(t.through_shm(p) == (hosts[static_cast<std::size_t>(p)] == hosts[static_cast<std::size_t>(r)]));
    }
    std::vector<std::vector<int>> out(static_cast<std::size_t>(n)), in(static_cast<std::size_t>(n));
    std::vector<mixed_transport::request> reqs;
    for (int p = 0; p < n; ++p) {
      const std::size_t len = 1000 + 70000 * static_cast<std::size_t>(p % 2);  // some past the single-copy size
      out[static_cast<std::size_t>(p)].assign(len, r * 100 + p);
      in[static_cast<std::size_t>(p)].assign(1000 + 70000 * static_cast<std::size_t>(r % 2), -1);
      reqs.push_back(t.irecv(p, 3, bytes_of(in[static_cast<std::size_t>(p)])));
    }
    for (int p = 0; p < n; ++p) reqs.push_back(t.isend(p, 3, signature{}, bytes_of(out[static_cast<std::size_t>(p)])));
    for (auto& q : reqs) q.wait(deadline::after(10s));
    for (int p = 0; p < n; ++p) {
      TCHECK(reqs[static_cast<std::size_t>(p)].info().peer == p);
      const auto& got = in[static_cast<std::size_t>(p)];
      TCHECK(std::all_of(got.begin(), got.end(), [&](int x) { return x == p * 100 + r; }));
    }
  });
}

TEST_CASE("mixed: receives from any peer take each message once whichever path it comes by", "[mixed]") {
  constexpr int per_sender = 200;
  std::map<int, std::vector<int>> seen;  // sender -> sequence numbers in arrival order
  run_mixed({"a", "a", "b", "a", "b"}, [&](int r, mixed_transport& t) {
    if (r == 0) {
      for (int i = 0; i < per_sender * (t.size() - 1); ++i) {
        std::vector<int> msg(2, -1);
        auto q = t.irecv(any_peer, 9, bytes_of(msg));
        q.wait(deadline::after(10s));
        TCHECK(q.info().peer == msg[0]);
        seen[msg[0]].push_back(msg[1]);
      }
      return;
    }
    for (int i = 0; i < per_sender; ++i) {
      std::vector<int> msg{r, i};
      t.isend(0, 9, signature{}, bytes_of(msg)).wait(deadline::after(10s));
    }
  });
  REQUIRE(seen.size() == 4);
  for (auto& [sender, seq] : seen) {
    std::vector<int> want(per_sender);
    std::iota(want.begin(), want.end(), 0);
    INFO("from rank " << sender);
    CHECK(seq == want);  // each once, in the order sent
  }
}

TEST_CASE("mixed: one host uses shared memory alone, and either path can be forced", "[mixed]") {
  run_mixed({"a", "a", "a"}, [](int, mixed_transport& t) {
    for (int p = 0; p < 3; ++p) TCHECK(t.through_shm(p));
    TCHECK(t.failure().empty());
  });
  run_mixed({"a"}, [](int, mixed_transport& t) {  // one rank: its sends to itself go through shared memory
    std::vector<int> v{1, 2, 3}, w(3);
    auto rq = t.irecv(0, 1, bytes_of(w));
    t.isend(0, 1, signature{}, bytes_of(v)).wait(deadline::after(5s));
    rq.wait(deadline::after(5s));
    TCHECK(w == v);
  });
  run_mixed({"a", "a", "a"}, [](int, mixed_transport& t) {
    for (int p = 0; p < 3; ++p) TCHECK(!t.through_shm(p));
  }, peer_path::tcp);
  CHECK_THROWS_WITH(run_mixed({"a", "b"}, [](int, mixed_transport&) {}, peer_path::shm),
                    Catch::Contains("DTRAIN_TRANSPORT=shm"));
}

TEST_CASE("mixed: collectives on 2 to 6 ranks over 1 to 3 hosts match the serial reference", "[mixed]") {
  const std::vector<std::vector<std::string>> layouts{
      {"a", "b"}, {"a", "a", "b"}, {"a", "b", "a", "b"}, {"a", "a", "b", "b", "c"}, {"a", "b", "c", "a", "b", "c"}};
  for (const auto& hosts : layouts) {
    const int p = static_cast<int>(hosts.size());
    std::atomic<int> wrong{0};
    run_mixed(hosts, [&](int r, mixed_transport& t) {
      communicator<mixed_transport> c(std::move(t));
      testing::sweep_collectives(c, p, r, {0, 7, 70001}, wrong);
    });
    INFO(p << " ranks");
    CHECK(wrong == 0);
  }
}

TEST_CASE("mixed: a late rank joins over TCP after the shared-memory group formed, nobody waiting for it", "[mixed]") {
  // Ranks 0 and 1 share host "a" and form their group; rank 2, late (also on "a"), comes once
  // they have exchanged a message, and reaches both over TCP.
  tcp_store_server server("127.0.0.1", 0, token);
  std::promise<void> formed;
  std::shared_future<void> early_done = formed.get_future().share();
  std::atomic<int> early_exchanges{0};
  std::vector<std::string> errors(3), got(3);
  auto rank = [&](int r) {
    if (r == 2) early_done.wait();
    tcp_store store("127.0.0.1", server.port(), deadline::after(10s), token);
    mixed_options o;
    o.tcp.token = o.shm.token = token;
    o.tcp.timeout = o.shm.timeout = 20s;
    o.tcp.late_ranks = 1;
    o.host_id = "a";
    auto t = mixed_transport::connect(store, r, 3, o, "127.0.0.1");
    if (r < 2) {
      TCHECK(t.through_shm(1 - r));
      TCHECK_FALSE(t.through_shm(2));
      int v = r, w = -1;
      auto s = t.isend(1 - r, 1, signature{}, std::as_bytes(std::span(&v, 1)));
      t.irecv(1 - r, 1, std::as_writable_bytes(std::span(&w, 1))).wait(deadline::after(10s));
      s.wait(deadline::after(10s));
      if (w == 1 - r && ++early_exchanges == 2) formed.set_value();
    }
    // Everyone sends its rank to the next and receives from the one before.
    const std::string mine = "from rank " + std::to_string(r);
    auto sent = t.isend((r + 1) % 3, 2, signature{}, std::as_bytes(std::span(mine)));
    std::vector<std::byte> in;
    t.irecv((r + 2) % 3, 2, in).wait(deadline::after(10s));
    sent.wait(deadline::after(10s));
    got[static_cast<std::size_t>(r)].assign(reinterpret_cast<const char*>(in.data()), in.size());
  };
  std::vector<std::thread> ts;
  for (int r = 0; r < 3; ++r) {
    ts.push_back(testing::thread_keeping_error(errors[static_cast<std::size_t>(r)], [&, r] { rank(r); }));
  }
  for (auto& t : ts) t.join();
  for (const auto& e : errors) CHECK(e.empty());
  for (int r = 0; r < 3; ++r) CHECK(got[static_cast<std::size_t>(r)] == "from rank " + std::to_string((r + 2) % 3));
}
