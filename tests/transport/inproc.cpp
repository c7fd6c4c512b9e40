#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "../catch.hpp"
#include "dtrain/concepts/transport.hpp"
#include "dtrain/transport/inproc.hpp"
#include "parts_case.hpp"
#include "../support/thread_checks.hpp"

using namespace dtrain;
using namespace std::chrono_literals;

namespace {
std::span<std::byte> bytes_of(std::vector<int>& v) { return std::as_writable_bytes(std::span(v)); }
signature sig_with_seq(std::uint64_t seq) {
  signature s;
  s.seq = seq;
  return s;
}
}  // namespace

static_assert(transport<inproc_transport>);

TEST_CASE("inproc: a message arrives intact with its envelope, whichever side comes first",
          "[transport][inproc]") {
  for (bool send_first : {true, false}) {
    auto g = make_inproc_group(2);
    std::vector<int> out(1000), in(1000, -1);
    std::iota(out.begin(), out.end(), 5);
    inproc_request s, r;
    if (send_first) {
      s = g[0].isend(1, 42, sig_with_seq(9), bytes_of(out));
      CHECK_FALSE(s.test());  // rendezvous: nothing to copy into yet
      r = g[1].irecv(0, 42, bytes_of(in));
    } else {
      r = g[1].irecv(0, 42, bytes_of(in));
      s = g[0].isend(1, 42, sig_with_seq(9), bytes_of(out));
    }
    std::error_code ec;
    REQUIRE(r.wait(deadline::after(1s), ec));
    REQUIRE(s.wait(deadline::after(1s), ec));
    CHECK(in == out);
    CHECK(r.info().peer == 0);
    CHECK(r.info().tag == 42);
    CHECK(r.info().sig.seq == 9);
    CHECK(r.info().bytes == 4000);
  }
}

TEST_CASE("inproc: per (sender, tag) order is kept and tags do not mix", "[transport][inproc]") {
  auto g = make_inproc_group(2);
  constexpr int n = 200;
  std::vector<std::vector<int>> msgs(n);
  std::vector<inproc_request> sends;
  for (int i = 0; i < n; ++i) {
    msgs[i] = {i};
    sends.push_back(g[0].isend(1, static_cast<std::uint64_t>(i % 2), signature{}, bytes_of(msgs[i])));
  }
  // Receive tag 1 first: its messages must come in their own order, skipping tag 0's.
  for (int tag : {1, 0}) {
    for (int i = tag; i < n; i += 2) {
      std::vector<int> got(1, -1);
      auto r = g[1].irecv(0, static_cast<std::uint64_t>(tag), bytes_of(got));
      r.wait(deadline::after(1s));
      REQUIRE(got[0] == i);
    }
  }
  for (auto& s : sends) s.wait(deadline::after(1s));
}

TEST_CASE("inproc: any_peer receives and resizing receives", "[transport][inproc]") {
  run_inproc(4, [](int rank, inproc_transport t) {
    if (rank == 0) {
      std::vector<bool> seen(4, false);
      for (int i = 0; i < 3; ++i) {
        std::vector<std::byte> buf;  // size unknown to the receiver
        auto r = t.irecv(any_peer, 7, buf);
        r.wait(deadline::after(5s));
        int from = r.info().peer;
        TREQUIRE(from >= 1);
        TREQUIRE(buf.size() == static_cast<std::size_t>(from) * 100 * sizeof(int));
        std::vector<int> vals(buf.size() / sizeof(int));
        std::memcpy(vals.data(), buf.data(), buf.size());
        TREQUIRE(std::all_of(vals.begin(), vals.end(), [&](int v) { return v == from; }));
        seen[static_cast<std::size_t>(from)] = true;
      }
      TCHECK(std::count(seen.begin(), seen.end(), true) == 3);
    } else {
      std::vector<int> payload(static_cast<std::size_t>(rank) * 100, rank);
      auto s = t.isend(0, 7, signature{}, bytes_of(payload));
      s.wait(deadline::after(5s));
    }
  });
}

TEST_CASE("inproc: gathered sends and scattered receives, every fit, whichever side comes first",
          "[transport][inproc]") {
  parts_case::tally t;
  run_inproc(2, [&](int r, inproc_transport e) { parts_case::run(r, e, t.checker()); });
  for (const auto& what : t.failed) FAIL_CHECK(what);
  CHECK(t.checks == parts_case::expected_checks);
}

TEST_CASE("inproc: a too-small buffer reports truncation and names the sender",
          "[transport][inproc]") {
  auto g = make_inproc_group(2);
  std::vector<int> out(10, 1), in(5, -1);
  auto s = g[0].isend(1, 0, sig_with_seq(3), bytes_of(out));
  auto r = g[1].irecv(0, 0, bytes_of(in));
  std::error_code ec;
  CHECK_FALSE(r.wait(deadline::after(1s), ec));
  CHECK(ec == errc::message_truncated);
  CHECK(r.info().peer == 0);
  CHECK(r.info().sig.seq == 3);
  CHECK(in == std::vector<int>(5, -1));  // nothing written past, nothing written at all
}

TEST_CASE("inproc: a wait past its deadline times out, on time, and can be cancelled",
          "[transport][inproc]") {
  auto g = make_inproc_group(2);
  std::vector<int> in(4);
  auto r = g[1].irecv(0, 0, bytes_of(in));
  auto start = std::chrono::steady_clock::now();
  std::error_code ec;
  CHECK_FALSE(r.wait(deadline::after(100ms), ec));
  auto took = std::chrono::steady_clock::now() - start;
  CHECK(ec == errc::timeout);
  CHECK(took >= 100ms);
  CHECK(took < 2s);
  try {
    r.wait(deadline::after(1ms));
    FAIL("expected a timeout");
  } catch (const error& e) {
    CHECK(e.code() == errc::timeout);
    const std::string what = e.what();
    CHECK(what.find("receive from rank 0 on tag 0") != std::string::npos);
    const std::string reason = make_error_code(errc::timeout).message();
    CHECK(what.find(reason) != std::string::npos);
    CHECK(what.find(reason) == what.rfind(reason));  // said once
  }
  r.cancel();
  CHECK(r.test());
  // The cancelled receive no longer matches: the next message goes to the next receive.
  std::vector<int> out{1, 2, 3, 4}, in2(4);
  auto s = g[0].isend(1, 0, signature{}, bytes_of(out));
  auto r2 = g[1].irecv(0, 0, bytes_of(in2));
  r2.wait(deadline::after(1s));
  CHECK(in2 == out);
  CHECK(in == std::vector<int>(4, 0));
}

TEST_CASE("inproc: destroying an unfinished send withdraws it", "[transport][inproc]") {
  auto g = make_inproc_group(2);
  {
    std::vector<int> doomed(3, 9);
    auto s = g[0].isend(1, 0, signature{}, bytes_of(doomed));
  }  // handle and buffer gone; the receiver must never see that buffer
  std::vector<int> out{1, 2, 3}, in(3);
  auto s = g[0].isend(1, 0, signature{}, bytes_of(out));
  auto r = g[1].irecv(0, 0, bytes_of(in));
  r.wait(deadline::after(1s));
  CHECK(in == out);
}

TEST_CASE("inproc: a rank that leaves fails what waits on it with peer_lost, at once",
          "[transport][inproc]") {
  auto g = make_inproc_group(3);
  std::vector<int> in(4);
  auto waiting = g[1].irecv(2, 0, bytes_of(in));
  std::vector<int> out(4, 1);
  auto stuck_send = g[1].isend(2, 0, signature{}, bytes_of(out));
  auto start = std::chrono::steady_clock::now();
  std::thread leaver([&] {
    std::this_thread::sleep_for(50ms);
    g[2].leave();
  });
  std::error_code ec;
  CHECK_FALSE(waiting.wait(deadline::after(10s), ec));
  CHECK(ec == errc::peer_lost);
  CHECK_FALSE(stuck_send.wait(deadline::after(10s), ec));
  CHECK(ec == errc::peer_lost);
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  leaver.join();
  // Later operations involving the departed rank fail immediately.
  CHECK_FALSE(g[1].irecv(2, 0, bytes_of(in)).wait(deadline::after(10s), ec));
  CHECK(ec == errc::peer_lost);
  CHECK_FALSE(g[0].isend(2, 0, signature{}, bytes_of(out)).wait(deadline::after(10s), ec));
  CHECK(ec == errc::peer_lost);
}

TEST_CASE("inproc: many threads sending and receiving at once lose nothing",
          "[transport][inproc]") {
  constexpr int p = 6;
  constexpr int rounds = 300;
  run_inproc(p, [](int rank, inproc_transport t) {
    // Every rank sends `rounds` numbered messages to every other rank and checks what it gets.
    std::vector<std::vector<int>> out(p * rounds);
    std::vector<inproc_request> sends;
    std::vector<std::vector<int>> in(p * rounds, std::vector<int>(2));
    std::vector<inproc_request> recvs;
    for (int i = 0; i < rounds; ++i) {
      for (int peer = 0; peer < p; ++peer) {
        if (peer == rank) continue;
        auto k = static_cast<std::size_t>(peer * rounds + i);
        recvs.push_back(t.irecv(peer, 1, bytes_of(in[k])));
        out[k] = {rank, i};
        sends.push_back(t.isend(peer, 1, signature{}, bytes_of(out[k])));
      }
    }
    for (auto& r : recvs) r.wait(deadline::after(30s));
    for (auto& s : sends) s.wait(deadline::after(30s));
    for (int peer = 0; peer < p; ++peer) {
      if (peer == rank) continue;
      for (int i = 0; i < rounds; ++i) {
        auto& got = in[static_cast<std::size_t>(peer * rounds + i)];
        if (got[0] != peer || got[1] != i) TFAIL("wrong message from " << peer << " round " << i);
      }
    }
  });
}

TEST_CASE("run_inproc: runs every rank on its own thread and rethrows the first failure",
          "[transport][inproc]") {
  std::vector<std::thread::id> ids(4);
  run_inproc(4, [&](int rank, inproc_transport t) {
    TREQUIRE(t.rank() == rank);
    TREQUIRE(t.size() == 4);
    ids[static_cast<std::size_t>(rank)] = std::this_thread::get_id();
  });
  std::sort(ids.begin(), ids.end());
  CHECK(std::unique(ids.begin(), ids.end()) == ids.end());
  CHECK(std::find(ids.begin(), ids.end(), std::this_thread::get_id()) == ids.end());

  // Rank 1 fails; rank 0, waiting on it, is released by peer_lost rather than its deadline.
  std::error_code rank0;
  auto start = std::chrono::steady_clock::now();
  try {
    run_inproc(2, [&](int rank, inproc_transport t) {
      if (rank == 1) throw error(errc::invalid_argument, "rank 1 gave up");
      std::vector<int> in(1);
      t.irecv(1, 0, bytes_of(in)).wait(deadline::after(30s), rank0);
    });
    FAIL("the failure of rank 1 was not rethrown");
  } catch (const error& e) {
    CHECK(e.code() == errc::invalid_argument);
    CHECK(std::string(e.what()) == "rank 1 gave up: invalid argument");
  }
  CHECK(rank0 == errc::peer_lost);
  CHECK(std::chrono::steady_clock::now() - start < 10s);
}
