// Point-to-point messages of the staged communicator over real TCP sockets on loopback (ranks as
// threads), under Thrust's CPP system where "device" buffers are host memory and staging is a
// copy: the same code a CUDA build runs on device buffers (tests/gpu/staged_cuda.cu). Every
// posting order completes (send first, receive first, a ring of receive-first ranks, a swap, many
// in flight, beside collectives on another thread), each message lands whole and in order, and a
// receive of the wrong type or size, a silent peer and a bad tag fail with errors naming them.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "../catch.hpp"
#include "../support/thread_ranks.hpp"
#include "dtrain/collective/staged.hpp"
#include "dtrain/concepts/point_to_point.hpp"
#include "dtrain/flight/recorder.hpp"
#include "dtrain/transport/tcp.hpp"

using namespace dtrain;
using namespace std::chrono_literals;

static_assert(point_to_point<staged_communicator<tcp_transport>, float>);
static_assert(point_to_point<staged_communicator<tcp_transport>, bfloat16>);
static_assert(completion<staged_communicator<tcp_transport>::p2p_request>);

namespace {

using staged = staged_communicator<tcp_transport>;
const std::string token = "staged-p2p";

// Runs body(rank, communicator) on `n` threads, each a TCP rank on loopback.
template <class Body>
void run_staged(int n, Body body, std::chrono::milliseconds timeout = 20s) {
  tcp_options o;
  o.token = token;
  o.timeout = timeout;
  auto connect = [&](tcp_store& store, int r) { return tcp_transport::connect(store, r, n, o, "127.0.0.1"); };
  testing::run_thread_ranks(n, token, connect, [&](int r, tcp_transport& t) {
    communicator_options co;
    co.timeout = timeout;
    staged comm(std::move(t), co);
    body(r, comm);
  });
}

// Message `m` from rank `from`: values no other message has, so a misdelivery shows.
std::vector<double> message(int from, int m, std::size_t n) {
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = from * 1e6 + m * 1e3 + static_cast<double>(i) / 4;
  return v;
}

std::string error_of(auto&& f) {
  try {
    f();
  } catch (const dtrain::error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("staged p2p: a receive posted before its send completes, in a two-rank swap and a ring", "[staged][p2p]") {
  for (int p : {2, 3, 5}) {
    std::atomic<int> wrong{0};
    run_staged(p, [&](int r, staged& c) {
      const int next = (r + 1) % p, prev = (r + p - 1) % p;
      const std::size_t n = 1000 + static_cast<std::size_t>(r);  // each link its own size
      std::vector<double> in(1000 + static_cast<std::size_t>(prev));
      auto rx = c.irecv(prev, 7, std::span(in));  // every rank receives first
      std::this_thread::sleep_for(20ms);           // and the receives are surely posted first
      const auto out = message(r, 0, n);
      auto tx = c.isend(next, 7, std::span<const double>(out));
      rx.wait(deadline::after(10s));
      tx.wait(deadline::after(10s));
      if (in != message(prev, 0, in.size())) ++wrong;
    });
    CHECK(wrong == 0);
  }
}

TEST_CASE("staged p2p: send first, receive first, and many in flight arrive whole and in order", "[staged][p2p]") {
  constexpr int messages = 40;
  std::atomic<int> wrong{0};
  run_staged(2, [&](int r, staged& c) {
    if (r == 0) {
      std::vector<staged::p2p_request> sends;
      for (int m = 0; m < messages; ++m) {
        const auto v = message(0, m, static_cast<std::size_t>(m) * 997 + 1);
        sends.push_back(c.isend(1, 3, std::span<const double>(v)));  // copied out: `v` may go
      }
      for (auto& s : sends) s.wait(deadline::after(10s));
      c.send(1, 4, std::span<const double>(message(0, 99, 5)));  // blocking, before its receive
    } else {
      std::vector<std::vector<double>> in(messages);
      std::vector<staged::p2p_request> receives;
      for (int m = 0; m < messages; ++m) {
        in[static_cast<std::size_t>(m)].resize(static_cast<std::size_t>(m) * 997 + 1);
        receives.push_back(c.irecv(0, 3, std::span(in[static_cast<std::size_t>(m)])));
        if (m == messages / 2) std::this_thread::sleep_for(30ms);  // later sends arrive unexpected
      }
      for (int m = messages; m-- > 0;) receives[static_cast<std::size_t>(m)].wait(deadline::after(10s));
      for (int m = 0; m < messages; ++m) {
        wrong += in[static_cast<std::size_t>(m)] != message(0, m, in[static_cast<std::size_t>(m)].size());
      }
      std::this_thread::sleep_for(30ms);
      std::vector<double> last(5);
      c.recv(0, 4, std::span(last));
      wrong += last != message(0, 99, 5);
    }
  });
  CHECK(wrong == 0);
}

TEST_CASE("staged p2p: test() finishes a receive, and messages run beside collectives on another thread",
          "[staged][p2p]") {
  std::atomic<int> wrong{0};
  run_staged(3, [&](int r, staged& c) {
    std::vector<double> sum(4096, static_cast<double>(r + 1));
    std::thread collectives([&] {
      for (int i = 0; i < 20; ++i) c.host().allreduce(std::span(sum), reduce_op::sum);
    });
    const int peer = r ^ 1;  // 0 <-> 1 swap; rank 2 talks to itself
    const int to = peer < 3 ? peer : r;
    std::vector<float> in(300);
    auto rx = c.irecv(to, 9, std::span(in));
    const std::vector<float> out(300, static_cast<float>(r) + 0.5f);
    auto tx = c.isend(to, 9, std::span<const float>(out));
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (!rx.test() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    tx.wait(deadline::after(10s));
    collectives.join();
    wrong += in != std::vector<float>(300, static_cast<float>(to) + 0.5f);
    // After k allreduces (sums over 3 ranks) of 1, 2 and 3 every value is 6 * 3^(k-1).
    double expect = 6;
    for (int i = 1; i < 20; ++i) expect *= 3;
    wrong += sum.front() != expect || sum.back() != expect;
  });
  CHECK(wrong == 0);
}

TEST_CASE("staged p2p: a receive of another type or size fails naming both, and the next message still lands",
          "[staged][p2p]") {
  std::vector<std::string> said(4);
  std::atomic<int> wrong{0};
  run_staged(2, [&](int r, staged& c) {
    const auto v = message(0, 1, 64);
    if (r == 0) {
      c.send(1, 5, std::span<const double>(v));                 // 64 doubles
      c.send(1, 5, std::span<const double>(v).first(32));       // 32 doubles
      c.send(1, 5, std::span<const double>(v).first(8));        // 8 doubles
      c.send(1, 5, std::span<const double>(v));                 // 64 doubles: 512 bytes
      c.send(1, 6, std::span<const double>(message(0, 2, 8)));  // 8 doubles, after all that
    } else {
      std::vector<float> floats(64);
      said[0] = error_of([&] { c.recv(0, 5, std::span(floats)); });
      std::vector<double> small(16);
      said[1] = error_of([&] { c.recv(0, 5, std::span(small)); });  // 32 sent: larger than posted
      std::vector<double> large(9);
      said[2] = error_of([&] { c.recv(0, 5, std::span(large)); });  // 8 sent: smaller than posted
      std::vector<float> same_bytes(128);
      said[3] = error_of([&] { c.recv(0, 5, std::span(same_bytes)); });  // the type alone differs
      std::vector<double> fine(8);
      c.recv(0, 6, std::span(fine));
      wrong += fine != message(0, 2, 8);
    }
  });
  CHECK(wrong == 0);
  CHECK_THAT(said[0], Catch::Contains("receive from rank 0 (tag 5) at rank 1") &&
                          Catch::Contains("expected 64 float32, the sender sent 64 float64"));
  CHECK_THAT(said[1], Catch::Contains("expected 16 float64, the sender sent 32 float64"));
  CHECK_THAT(said[2], Catch::Contains("expected 9 float64, the sender sent 8 float64"));
  CHECK_THAT(said[3], Catch::Contains("expected 128 float32, the sender sent 64 float64"));
}

TEST_CASE("staged p2p: a wait that times out leaves the receive pending, a later message still lands",
          "[staged][p2p]") {
  std::string first_wait, never_sent;
  std::atomic<int> wrong{0};
  run_staged(
      2,
      [&](int r, staged& c) {
        std::vector<double> in(4);
        if (r == 1) {
          auto rx = c.irecv(0, 11, std::span(in));
          std::error_code ec;
          if (!rx.wait(deadline::after(50ms), ec)) first_wait = ec.message();
          c.host().barrier();  // only now does rank 0 send
          rx.wait(deadline::after(10s));
          wrong += in != message(0, 3, 4);
          std::vector<double> none(4);
          auto silent = c.irecv(0, 12, std::span(none));
          never_sent = error_of([&] { silent.wait(deadline::after(100ms)); });
        } else {
          c.host().barrier();
          c.send(1, 11, std::span<const double>(message(0, 3, 4)));
        }
        c.host().barrier();
      },
      5s);
  CHECK(wrong == 0);
  CHECK(first_wait == make_error_code(errc::timeout).message());
  CHECK_THAT(never_sent, Catch::Contains("receive from rank 0 (tag 12) at rank 1") &&
                             Catch::Contains("deadline"));
}

TEST_CASE("staged p2p: a cancelled receive takes no message, a moved-from one is finished and empty",
          "[staged][p2p]") {
  std::atomic<int> wrong{0};
  std::string after_cancel;
  run_staged(2, [&](int r, staged& c) {
    if (r == 1) {
      std::vector<double> dropped(6, -1.0);
      auto gone = c.irecv(0, 13, std::span(dropped));
      gone.cancel();
      std::error_code ec;
      if (!gone.wait(deadline::after(10ms), ec)) after_cancel = ec.message();
      c.host().barrier();  // rank 0 sends two messages on tag 13 after the cancel
      std::vector<double> first(6), second(6);
      c.recv(0, 13, std::span(first));
      c.recv(0, 13, std::span(second));
      wrong += first != message(0, 0, 6) || second != message(0, 1, 6);
      wrong += dropped != std::vector<double>(6, -1.0);  // nothing landed in the cancelled buffer
      // A moved-from handle: finished and empty, its wait succeeds at once.
      std::vector<double> in(6);
      auto rx = c.irecv(0, 14, std::span(in));
      staged::p2p_request moved = std::move(rx);
      std::error_code none;
      wrong += !rx.test() || !rx.wait(deadline::after(0ms), none);
      moved.wait(deadline::after(10s));
      wrong += in != message(0, 2, 6);
    } else {
      c.host().barrier();
      c.send(1, 13, std::span<const double>(message(0, 0, 6)));
      c.send(1, 13, std::span<const double>(message(0, 1, 6)));
      c.send(1, 14, std::span<const double>(message(0, 2, 6)));
    }
  });
  CHECK(wrong == 0);
  CHECK(after_cancel == make_error_code(errc::cancelled).message());
}

TEST_CASE("staged p2p: bad arguments are refused naming them", "[staged][p2p]") {
  std::string bad_tag, bad_peer, any_peer_refused;
  run_staged(2, [&](int r, staged& c) {
    if (r == 1) {
      std::vector<double> in(4);
      bad_tag = error_of([&] { c.irecv(0, c.host().options().tag, std::span(in)); });
      bad_peer = error_of([&] { c.isend(2, 1, std::span<const double>(in)); });
      any_peer_refused = error_of([&] { c.irecv(any_peer, 1, std::span(in)); });
    }
  });
  CHECK_THAT(bad_tag, Catch::Contains("is the collectives'"));
  CHECK_THAT(bad_peer, Catch::Contains("peer 2 of a group of 2"));
  CHECK_THAT(any_peer_refused, Catch::Contains("peer -1 of a group of 2"));
}

TEST_CASE("staged p2p: each message goes into the flight recorder, numbered per tag, with its peer and direction",
          "[staged][p2p][flight]") {
  constexpr std::uint64_t tag = 0x5ca1'ab1e;
  run_staged(2, [&](int r, staged& c) {
    std::vector<double> buf(3, 1.0);
    for (int m = 0; m < 2; ++m) {
      if (r == 0) c.send(1, tag, std::span<const double>(buf));
      if (r == 1) c.recv(0, tag, std::span(buf));
    }
  });
  std::vector<flight::call> seen;
  flight::recorder::global().for_each([&](const flight::call& x) {
    if (x.sig.op == coll_op::message && x.tag == tag) seen.push_back(x);
  });
  REQUIRE(seen.size() == 4);
  int sends = 0;
  for (const auto& x : seen) {
    sends += x.sending ? 1 : 0;
    CHECK(x.peer == (x.sending ? 1 : 0));
    CHECK(x.rank == (x.sending ? 0 : 1));
    CHECK(x.where == flight::state::completed);
    CHECK(x.sig.type == dtype::float64);
    CHECK(x.sig.count == 3);
  }
  CHECK(sends == 2);
  // Rank 0's sends and rank 1's receives, each numbered 1, 2 in the order posted.
  for (const bool sending : {true, false}) {
    std::vector<std::uint64_t> ks;
    for (const auto& x : seen) {
      if (x.sending == sending) ks.push_back(x.sig.seq);
    }
    CHECK(ks == std::vector<std::uint64_t>{1, 2});
  }
}
