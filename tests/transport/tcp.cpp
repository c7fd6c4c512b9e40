// tcp_transport with real sockets on loopback, ranks as threads of this process (the
// multi-process tests are tcp_worker + tcp_faults): matching and ordering, the eager and direct
// paths, truncation, self-sends, graceful shutdown, malformed frames from an authenticated peer,
// group formation errors, the spin progress policy.
// Forming groups (and failing to) is in tcp_forming.cpp.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <future>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "../catch.hpp"
#include "../support/thread_checks.hpp"
#include "../support/thread_ranks.hpp"
#include "dtrain/collective/communicator.hpp"
#include "dtrain/transport/group.hpp"
#include "dtrain/transport/tcp.hpp"
#include "parts_case.hpp"
#include "tcp_ranks.hpp"

using namespace dtrain;
using namespace std::chrono_literals;

// Halving-doubling's pieces over TCP (docs/transports.md, "Larger pieces over TCP"), the same in a
// group formed from it.
static_assert(reduce_piece_bytes_of<tcp_transport> == std::size_t{512} << 10);
static_assert(reduce_piece_bytes_of<process_group<tcp_transport>> == std::size_t{512} << 10);

using namespace dtrain::tcp_case;

namespace {

using testing::bytes_of;
using testing::sig_for;

}  // namespace

TEST_CASE("tcp: messages on one tag arrive in order, whichever side comes first", "[tcp]") {
  run_tcp(2, [](int r, tcp_transport& t) {
    constexpr int messages = 50;
    if (r == 0) {
      std::vector<std::vector<int>> out(messages);
      std::vector<tcp_request> sends;
      for (int i = 0; i < messages; ++i) {
        out[static_cast<std::size_t>(i)].assign(static_cast<std::size_t>(i * 1000 + 1), i);
        sends.push_back(
            t.isend(1, 7, sig_for(static_cast<std::uint64_t>(i)), bytes_of(out[static_cast<std::size_t>(i)])));
      }
      for (auto& s : sends) s.wait(deadline::after(10s));
    } else {
      for (int i = 0; i < messages; ++i) {
        if (i == messages / 2) std::this_thread::sleep_for(50ms);  // later ones arrive unexpected
        std::vector<int> in(static_cast<std::size_t>(i * 1000 + 1), -1);
        auto req = t.irecv(0, 7, bytes_of(in));
        req.wait(deadline::after(10s));
        TCHECK(req.info().peer == 0);
        TCHECK(req.info().sig.count == static_cast<std::uint64_t>(i));
        TCHECK(req.info().bytes == in.size() * sizeof(int));
        TCHECK(std::all_of(in.begin(), in.end(), [i](int x) { return x == i; }));
      }
    }
  });
}

TEST_CASE("tcp: gathered sends and scattered receives, every fit, whichever side comes first", "[tcp]") {
  parts_case::tally tally;
  run_tcp(2, [&](int r, tcp_transport& t) { parts_case::run(r, t, tally.checker()); });
  for (const auto& what : tally.failed) FAIL_CHECK(what);
  CHECK(tally.checks == parts_case::expected_checks);
}

TEST_CASE("tcp: any_peer, tags, self-sends, resizing receives", "[tcp]") {
  run_tcp(3, [](int r, tcp_transport& t) {
    std::vector<int> mine(100, r);
    auto self = t.isend(r, 99, sig_for(1), bytes_of(mine));
    std::vector<int> back(100, -1);
    t.irecv(r, 99, bytes_of(back)).wait(deadline::after(5s));
    self.wait(deadline::after(5s));
    TCHECK(back == mine);
    if (r == 0) {
      std::set<int> from;
      for (int i = 0; i < 2; ++i) {
        std::vector<std::byte> v;
        auto req = t.irecv(any_peer, 5, v);
        req.wait(deadline::after(5s));
        from.insert(req.info().peer);
        TCHECK(v.size() == static_cast<std::size_t>(req.info().peer) * 4000);
      }
      TCHECK(from == std::set<int>{1, 2});
    } else {
      std::vector<int> payload(static_cast<std::size_t>(r) * 1000, r);
      t.isend(0, 5, sig_for(0), bytes_of(payload)).wait(deadline::after(5s));
    }
  });
}

TEST_CASE("tcp: a message larger than the posted buffer is reported as truncated and consumed", "[tcp]") {
  run_tcp(2, [](int r, tcp_transport& t) {
    if (r == 0) {
      std::vector<int> big(1000, 1), next(10, 2);
      auto a = t.isend(1, 1, sig_for(1000), bytes_of(big));
      auto b = t.isend(1, 1, sig_for(10), bytes_of(next));
      a.wait(deadline::after(5s));
      b.wait(deadline::after(5s));
    } else {
      std::vector<int> small(10, -1);
      auto req = t.irecv(0, 1, bytes_of(small));
      std::error_code ec;
      const bool done = req.wait(deadline::after(5s), ec);  // not under the checks' lock
      TCHECK_FALSE(done);
      TCHECK(ec == errc::message_truncated);
      TCHECK(req.info().sig.count == 1000);  // names what was sent, for mismatch reports
      t.irecv(0, 1, bytes_of(small)).wait(deadline::after(5s));  // the stream kept its place
      TCHECK(std::all_of(small.begin(), small.end(), [](int x) { return x == 2; }));
    }
  });
}

TEST_CASE("tcp: a rank that exits right after sending loses nothing (graceful shutdown)", "[tcp]") {
  constexpr std::size_t n = 16 << 20;
  run_tcp(2, [](int r, tcp_transport& t) {
    if (r == 1) {
      std::vector<int> out(n / sizeof(int));
      std::iota(out.begin(), out.end(), 0);
      t.isend(0, 3, sig_for(0), bytes_of(out)).wait(deadline::after(10s));
      t.leave();  // as if the process exited now
    } else {
      std::this_thread::sleep_for(300ms);  // the receive is posted late
      std::vector<int> in(n / sizeof(int), -1);
      t.irecv(1, 3, bytes_of(in)).wait(deadline::after(10s));
      for (std::size_t i = 0; i < in.size(); ++i) {
        if (in[i] != static_cast<int>(i)) {
          TFAIL("element " << i << " is " << in[i]);
          break;
        }
      }
      // The peer has gone: a new receive from it fails at once, naming it.
      std::vector<int> more(1);
      auto req = t.irecv(1, 3, bytes_of(more));
      std::error_code ec;
      const bool done = req.wait(deadline::after(5s), ec);  // not under the checks' lock
      TCHECK_FALSE(done);
      TCHECK(ec == errc::peer_lost);
      TCHECK(req.detail().find("rank 1") != std::string::npos);
    }
  });
}

TEST_CASE("tcp: collectives run unchanged over it, blocking and spinning", "[tcp]") {
  auto body = [](int r, auto& t) {
    using T = std::remove_reference_t<decltype(t)>;
    communicator<T> c(std::move(t));
    std::vector<double> v(100003);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(r * 7 + static_cast<int>(i % 13));
    c.allreduce(std::span(v), reduce_op::sum);
    for (std::size_t i = 0; i < v.size(); ++i) {
      double want = 0;
      for (int q = 0; q < 4; ++q) want += q * 7 + static_cast<int>(i % 13);
      if (v[i] != want) {
        TFAIL("element " << i);
        break;
      }
    }
    std::vector<int> all(4 * 5);
    std::vector<int> mine(5, r);
    c.template allgather<int>(mine, std::span(all));
    for (std::size_t i = 0; i < all.size(); ++i) TCHECK(all[i] == static_cast<int>(i / 5));
  };
  run_tcp(4, body);
  run_tcp<basic_tcp_transport<spin_then_block<20>>>(4, body);
}

// A waiter reads its peer's connection itself, and leaves it disarmed for the reader thread until
// it has been idle for a millisecond: the next call's messages, which often come before their
// receives are posted, stay in the socket for the waiter instead of waking the reader thread.
TEST_CASE("tcp: collectives run back to back are read by the threads that wait for them, not the reader thread",
          "[tcp]") {
  constexpr int ranks = 4, calls = 2000;
  using blocking_tcp = basic_tcp_transport<blocking>;  // waiters that sleep in poll, as on any host with few cores
  auto frames_by_reader = [] {
    std::atomic<std::uint64_t> by_reader{0};
    run_tcp<blocking_tcp>(ranks, [&](int r, auto& t) {
      communicator<blocking_tcp> c(std::move(t));
      std::vector<double> v(256);
      for (int k = 0; k < calls; ++k) {
        std::ranges::fill(v, r + k);
        c.allreduce(std::span(v), reduce_op::sum, algorithm::recursive_doubling);
        const double sum = ranks * k + ranks * (ranks - 1) / 2;  // each rank gives r + k
        if (v.front() != sum || v.back() != sum) {
          TFAIL("call " << k << " summed to " << v.front());
          break;
        }
      }
      by_reader += c.transport().frames_read_by_reader();
    });
    return by_reader.load();
  };
  const std::uint64_t frames = std::uint64_t{ranks} * 2 * calls;  // two exchanges per call and rank
  // Before the idle rule: 6-9% here, 22-28% beside two busy loops, in every run. With it, well
  // under 1% quiet, but a run beside a busy test suite can pass 3%: so the best of three runs,
  // and none past 10% (a rule that fails now and then, badly, fails here too).
  std::vector<std::uint64_t> runs;
  while (runs.size() < 3 && (runs.empty() || runs.back() >= frames / 32)) runs.push_back(frames_by_reader());
  const std::string seen = Catch::Detail::stringify(runs);
  if (runs.size() > 1) WARN("frames read by the reader thread needed " << runs.size() << " runs: " << seen);
  INFO("frames read by the reader thread, of " << frames << ", in each run: " << seen);
  CHECK(std::ranges::min(runs) < frames / 32);
  CHECK(std::ranges::max(runs) < frames / 10);
}

// The other side of that rule: what nobody waits for on a connection a waiter has just left is
// still read soon, by the reader thread (an any-peer receive waits on its flag and reads nothing).
TEST_CASE("tcp: a message nobody reads for on a connection a waiter just left arrives within milliseconds",
          "[tcp]") {
  run_tcp<basic_tcp_transport<blocking>>(2, [](int r, auto& t) {
    std::vector<int> first(64, 1), second(64, 2);
    if (r == 1) {
      t.isend(0, 1, sig_for(1), bytes_of(first)).wait(deadline::after(5s));
      std::this_thread::sleep_for(20ms);  // after rank 0's wait has left the connection
      t.isend(0, 2, sig_for(2), bytes_of(second)).wait(deadline::after(5s));
      return;
    }
    std::vector<int> got(64, 0);
    t.irecv(1, 1, bytes_of(got)).wait(deadline::after(5s));  // this thread reads the connection
    TCHECK(got == first);
    const auto posted = std::chrono::steady_clock::now();
    std::vector<std::byte> later;
    t.irecv(any_peer, 2, later).wait(deadline::after(5s));
    const auto took = std::chrono::steady_clock::now() - posted;
    TCHECK(later.size() == second.size() * sizeof(int));
    // 20 ms until it is sent, then a millisecond or two; a connection kept from the reader for
    // half a second or more (or for good) fails here.
    TCHECK(took < 500ms);
  });
}

TEST_CASE("tcp: a root mismatch where both ranks only send is caught by the next call", "[tcp]") {
  // Each rank thinks the other is the root, so each sends and, its send buffered by TCP, returns:
  // nothing can be compared during the call. The stray message stays queued, signed reduce #0,
  // and the next call reports it by both names instead of reading it as its own.
  std::vector<std::string> msgs(2);
  std::vector<std::error_code> codes(2);
  run_tcp(2, [&](int r, tcp_transport& t) {
    binomial_tree<tcp_transport> c(std::move(t));
    std::vector<float> f(10, 1.0f);
    std::error_code ec;
    c.reduce(std::span(f), reduce_op::sum, r == 0 ? 1 : 0, ec);  // each names the other
    if (!ec) c.allreduce(std::span(f), reduce_op::sum, ec);
    codes[static_cast<std::size_t>(r)] = ec;
    msgs[static_cast<std::size_t>(r)] = c.last_error();
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << msgs[static_cast<std::size_t>(r)]);
    CHECK(codes[static_cast<std::size_t>(r)] == errc::collective_mismatch);
    CHECK(msgs[static_cast<std::size_t>(r)].find("reduce #0") != std::string::npos);
    CHECK(msgs[static_cast<std::size_t>(r)].find("allreduce #1") != std::string::npos);
  }
}

TEST_CASE("tcp: an oversized frame from an authenticated peer closes only that connection", "[tcp]") {
  tcp_store_server server("127.0.0.1", 0, token);
  std::atomic<bool> sent{false};
  std::thread fake([&] {
    // Speaks the real handshake as rank 1, then sends a header announcing 2 GiB.
    tcp_store store("127.0.0.1", server.port(), deadline::after(10s), token);
    auto where = value_text(store.get(epoch_key(0, "addr/0"), deadline::after(10s)));
    boost::asio::io_context io;
    detail::tcp::socket s(io);
    detail::tcp::resolver res(io);
    auto colon = where.rfind(':');
    boost::asio::connect(s, res.resolve(where.substr(0, colon), where.substr(colon + 1)));
    std::error_code hs;
    bool done = false;
    detail::auth::hello me;
    me.rank = 1;
    me.world = 2;
    detail::handshake::connect(s, token, 5s, me, [&](std::error_code ec, std::string, const detail::auth::hello&) {
      hs = ec;
      done = true;
    });
    io.run();
    TCHECK(done);
    TCHECK_FALSE(hs);
    if (!done || hs) return;
    if (store.add(epoch_key(0, "ready"), 1, deadline::after(10s)) == 2) {
      store.set(epoch_key(0, "ready/all"), as_value("1"), deadline::after(10s));
    }
    frame_header h;
    h.length = std::uint64_t{2} << 30;
    auto b = encode_frame(h);
    boost::asio::write(s, boost::asio::buffer(b));
    sent = true;
    std::this_thread::sleep_for(500ms);
  });
  {
    tcp_store store("127.0.0.1", server.port(), deadline::after(10s), token);
    auto t = tcp_transport::connect(store, 0, 2, test_options(), "127.0.0.1");
    std::vector<int> in(10);
    auto req = t.irecv(1, 0, bytes_of(in));
    std::error_code ec;
    const bool done = req.wait(deadline::after(10s), ec);  // not under the checks' lock
    TCHECK_FALSE(done);
    TCHECK(ec == errc::peer_lost);
    INFO(req.detail());
    TCHECK(req.detail().find("malformed frame") != std::string::npos);
    TCHECK(req.detail().find("exceeds the maximum") != std::string::npos);
    TCHECK(t.failure().find("rank 1") != std::string::npos);
  }
  fake.join();
  TCHECK(sent);
}
