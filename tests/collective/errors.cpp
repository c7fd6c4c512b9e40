// Failures are reported, typed and on time: mismatched collectives name both operations, missed
// deadlines name the operation, its sequence number and the peer, and nothing hangs.

#include <chrono>
#include <latch>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "../catch.hpp"
#include "dtrain/transport/inproc.hpp"
#include "dtrain/collective/communicator.hpp"
#include "../support/scoped_env.hpp"
#include "../support/thread_checks.hpp"
#include "../support/text.hpp"

using namespace dtrain;
using namespace std::chrono_literals;

namespace {
using dtrain::testing::has;

communicator_options with_timeout(std::chrono::milliseconds t) {
  communicator_options o;
  o.timeout = t;
  return o;
}
}  // namespace

TEST_CASE("errors: a different collective on another rank is a mismatch naming both",
          "[collective][errors]") {
  std::vector<std::string> messages(2);
  std::vector<std::error_code> codes(2);
  auto start = std::chrono::steady_clock::now();
  run_inproc(2, [&](int r, inproc_transport t) {
    ring<inproc_transport> c(std::move(t), with_timeout(20s));
    std::vector<float> v(100, 1.0f);
    std::error_code ec;
    if (r == 0) {
      c.allreduce(std::span(v), reduce_op::sum, ec);
    } else {
      c.broadcast(std::span(v), 0, ec);
    }
    codes[static_cast<std::size_t>(r)] = ec;
    messages[static_cast<std::size_t>(r)] = c.last_error();
  });
  CHECK(std::chrono::steady_clock::now() - start < 2s);  // at once, not at the 20 s deadline
  // Rank 1 (in broadcast) receives rank 0's allreduce message first.
  CHECK(codes[1] == errc::collective_mismatch);
  CHECK(has(messages[1], "rank 1 is in broadcast #0"));
  CHECK(has(messages[1], "rank 0 sent a message of allreduce #0 (ring, float32 sum, count 100)"));
  // Rank 0 either sees rank 1's broadcast message or loses rank 1 when it gives up.
  CHECK(codes[0]);
  CHECK((codes[0] == errc::collective_mismatch || codes[0] == errc::peer_lost));
}

TEST_CASE("errors: mismatched count, type, op and sequence are all caught",
          "[collective][errors]") {
  enum class variant { count, type, op, skipped_call };
  for (variant v : {variant::count, variant::type, variant::op, variant::skipped_call}) {
    std::error_code rank1;
    std::string msg;
    run_inproc(2, [&](int r, inproc_transport t) {
      // A skipped call is caught when its first message reaches a rank already in the next
      // call: the dissemination barrier sends before it receives. (The tree barrier's root only
      // receives first; there the deadline ends it.) The caller's rules come before the family's.
      communicator_options o = with_timeout(5s);
      o.algorithms.force(coll_op::barrier, algorithm::dissemination);
      binomial_tree<inproc_transport> c(std::move(t), o);
      std::vector<float> f(10, 1.0f);
      std::vector<double> d(10, 1.0);
      std::error_code ec;
      if (r == 0) {
        if (v == variant::skipped_call) c.barrier(ec);  // rank 0 runs one call more
        if (!ec) c.reduce(std::span(f), reduce_op::sum, 1, ec);
        return;
      }
      switch (v) {
        case variant::count: c.reduce(std::span(f).first(9), reduce_op::sum, 1, ec); break;
        case variant::type: c.reduce(std::span(d), reduce_op::sum, 1, ec); break;
        case variant::op: c.reduce(std::span(f), reduce_op::max, 1, ec); break;
        case variant::skipped_call: c.reduce(std::span(f), reduce_op::sum, 1, ec); break;
      }
      rank1 = ec;
      msg = c.last_error();
    });
    INFO(msg);
    CHECK(rank1 == errc::collective_mismatch);
    CHECK(has(msg, "collective mismatch"));
  }
}

TEST_CASE("errors: a split that differs between ranks names both sizes, and says why once",
          "[collective][errors]") {
  std::vector<std::string> whats(2);
  std::vector<std::error_code> codes(2);
  run_inproc(2, [&](int r, inproc_transport t) {
    ring<inproc_transport> c(std::move(t), with_timeout(5s));
    std::vector<float> in(3, 1.0f);
    // Rank 0 splits 3 elements as [1, 2], rank 1 as [2, 1]: same call, same total.
    const std::vector<std::size_t> counts = r == 0 ? std::vector<std::size_t>{1, 2} : std::vector<std::size_t>{2, 1};
    std::vector<float> out(counts[static_cast<std::size_t>(r)]);
    try {
      c.reduce_scatterv<float>(std::span(in), counts, std::span(out), reduce_op::sum);
    } catch (const error& e) {
      codes[static_cast<std::size_t>(r)] = e.code();
      whats[static_cast<std::size_t>(r)] = e.what();
    }
  });
  for (int r : {0, 1}) {
    const std::string& what = whats[static_cast<std::size_t>(r)];
    INFO(what);
    CHECK(codes[static_cast<std::size_t>(r)] == errc::message_truncated);
    CHECK(has(what, "reduce_scatterv #0"));
    CHECK(has(what, "received 8 bytes from rank " + std::to_string(1 - r) + " where 4 were expected"));
    const std::string reason = "message larger than the receive buffer";
    CHECK(what.find(reason) != std::string::npos);
    CHECK(what.find(reason) == what.rfind(reason));  // said once, not once by each layer
  }
}

TEST_CASE("errors: a root mismatch where both ranks wait ends at the deadline, naming the peer",
          "[collective][errors]") {
  // Each rank thinks it is the root, so each only receives: no message flows, nothing can be
  // compared, and the deadline is what ends the call (MPI and NCCL hang here).
  std::error_code ec0;
  std::string msg0;
  std::latch rank0_done(1);
  run_inproc(2, [&](int r, inproc_transport t) {
    binomial_tree<inproc_transport> c(std::move(t), with_timeout(2s));
    std::vector<float> f(10, 1.0f);
    std::error_code ec;
    c.reduce(std::span(f), reduce_op::sum, r == 0 ? 0 : 1, ec);  // each thinks it is root
    if (r == 0) {
      ec0 = ec;
      msg0 = c.last_error();
      rank0_done.count_down();
    } else {
      // Rank 1 stays in the group until rank 0 has seen its own deadline pass; leaving first
      // would turn rank 0's timeout into peer_lost when the two deadlines race.
      rank0_done.wait();
    }
  });
  INFO(msg0);
  CHECK(ec0 == errc::timeout);
  CHECK(has(msg0, "waiting for rank 1"));
}

TEST_CASE("errors: a root mismatch where messages flow is a mismatch naming both roots",
          "[collective][errors]") {
  // A chain broadcast: ranks 0-2 from root 0 (0 -> 1 -> 2 -> 3), rank 3 from root 1
  // (1 -> 2 -> 3 -> 0). Rank 3 receives from rank 2 in both chains, and rank 2's message is
  // signed root 0 where rank 3 expects root 1. The ranks whose part matched complete; only a
  // rank that receives can compare.
  std::vector<std::error_code> codes(4);
  std::vector<std::string> msgs(4);
  run_inproc(4, [&](int r, inproc_transport t) {
    communicator<inproc_transport> c(std::move(t), with_timeout(20s));
    c.algorithms().force(coll_op::broadcast, algorithm::ring);
    std::vector<float> f(10, static_cast<float>(r));
    std::error_code ec;
    c.broadcast(std::span(f), r == 3 ? 1 : 0, ec);
    codes[static_cast<std::size_t>(r)] = ec;
    msgs[static_cast<std::size_t>(r)] = c.last_error();
  });
  INFO(msgs[3]);
  CHECK(codes[3] == errc::collective_mismatch);
  CHECK(has(msgs[3], "rank 3 is in broadcast #0 (ring, float32, count 10, root 1)"));
  CHECK(has(msgs[3], "rank 2 sent a message of broadcast #0 (ring, float32, count 10, root 0)"));
}

TEST_CASE("errors: a root mismatch where both ranks only send ends at the deadline in-process",
          "[collective][errors]") {
  // Each rank thinks the other is the root, so each only sends. An in-process send completes when
  // a receive takes it, so neither returns as if it had succeeded: rank 1 times out naming
  // rank 0, and rank 0 then loses rank 1. (Over TCP the sends are buffered and return; the next
  // call catches the stray message: tests/transport/tcp.cpp.)
  std::vector<std::error_code> codes(2);
  std::vector<std::string> msgs(2);
  std::latch rank1_done(1);
  run_inproc(2, [&](int r, inproc_transport t) {
    binomial_tree<inproc_transport> c(std::move(t), with_timeout(r == 1 ? 1s : 20s));
    std::vector<float> f(10, 1.0f);
    std::error_code ec;
    c.reduce(std::span(f), reduce_op::sum, r == 0 ? 1 : 0, ec);  // each names the other
    codes[static_cast<std::size_t>(r)] = ec;
    msgs[static_cast<std::size_t>(r)] = c.last_error();
    if (r == 1) rank1_done.count_down();
  });
  INFO("rank 0: " << msgs[0] << "\nrank 1: " << msgs[1]);
  CHECK(codes[1] == errc::timeout);
  CHECK(has(msgs[1], "waiting for rank 0 (send to rank 0)"));
  CHECK(codes[0] == errc::peer_lost);
}

TEST_CASE("errors: a missed deadline names the operation, sequence number and peer, on time",
          "[collective][errors]") {
  std::string msg;
  std::error_code code;
  std::chrono::steady_clock::duration took{};
  run_inproc(3, [&](int r, inproc_transport t) {
    ring<inproc_transport> c(std::move(t), with_timeout(300ms));
    std::vector<float> v(64, 1.0f);
    c.allreduce(std::span(v), reduce_op::sum);  // #0 succeeds everywhere
    if (r == 2) {
      std::this_thread::sleep_for(1s);  // rank 2 never joins #1 in time; it stays in the group
      return;
    }
    auto start = std::chrono::steady_clock::now();
    std::error_code ec;
    c.allreduce(std::span(v), reduce_op::sum, ec);
    if (r == 0) {
      took = std::chrono::steady_clock::now() - start;
      code = ec;
      msg = c.last_error();
    }
  });
  INFO(msg);
  CHECK(code == errc::timeout);
  CHECK(has(msg, "allreduce #1 (ring, float32 sum, count 64)"));
  CHECK(has(msg, "timed out after 300 ms"));
  CHECK(has(msg, "rank 2"));  // rank 0's left neighbour in the ring
  CHECK(took >= 300ms);
  CHECK(took < 900ms);
}

TEST_CASE("errors: DTRAIN_COLLECTIVE_TIMEOUT_MS replaces the code's deadline, and a bad value is refused naming it",
          "[collective][errors]") {
  std::string msg;
  std::error_code code;
  std::chrono::steady_clock::duration took{};
  std::vector<std::chrono::milliseconds> deadlines(2);
  {
    testing::scoped_env env("DTRAIN_COLLECTIVE_TIMEOUT_MS", "300");
    run_inproc(2, [&](int r, inproc_transport t) {
      ring<inproc_transport> c(std::move(t), with_timeout(20s));  // the variable wins over 20 s
      deadlines[static_cast<std::size_t>(r)] = c.options().timeout;
      if (r == 1) {
        std::this_thread::sleep_for(1s);  // never joins the call in time
        return;
      }
      std::vector<float> v(64, 1.0f);
      const auto start = std::chrono::steady_clock::now();
      std::error_code ec;
      c.allreduce(std::span(v), reduce_op::sum, ec);
      took = std::chrono::steady_clock::now() - start;
      code = ec;
      msg = c.last_error();
    });
  }
  INFO(msg);
  CHECK(deadlines == std::vector<std::chrono::milliseconds>{300ms, 300ms});
  CHECK(code == errc::timeout);
  CHECK(has(msg, "timed out after 300 ms"));
  CHECK(took >= 300ms);
  CHECK(took < 900ms);
  for (const char* bad : {"0", "-5", "12x", "1.5", "+300", " 300", "2147483648", "9223372036854775807",
                          "99999999999999999999"}) {
    testing::scoped_env env("DTRAIN_COLLECTIVE_TIMEOUT_MS", bad);
    std::string refused;
    run_inproc(1, [&](int, inproc_transport t) {
      try {
        communicator<inproc_transport> c(std::move(t));
      } catch (const dtrain::error& e) {
        refused = e.code() == errc::invalid_argument ? e.what() : "";
      }
    });
    INFO(bad << ": " << refused);
    CHECK(has(refused, std::string("DTRAIN_COLLECTIVE_TIMEOUT_MS=") + bad));
  }
  {
    testing::scoped_env most("DTRAIN_COLLECTIVE_TIMEOUT_MS", "2147483647");  // the largest taken
    run_inproc(1, [&](int, inproc_transport t) {
      deadlines[0] = communicator<inproc_transport>(std::move(t)).options().timeout;
    });
  }
  CHECK(deadlines[0] == 2147483647ms);
  testing::scoped_env unset("DTRAIN_COLLECTIVE_TIMEOUT_MS", "");  // empty: as if unset
  run_inproc(1, [&](int, inproc_transport t) {
    deadlines[0] = communicator<inproc_transport>(std::move(t)).options().timeout;
  });
  CHECK(deadlines[0] == 60s);
}

TEST_CASE("errors: a rank that dies mid-collective fails the others with peer_lost, at once",
          "[collective][errors]") {
  std::vector<std::error_code> codes(4);
  std::vector<std::string> msgs(4);
  auto start = std::chrono::steady_clock::now();
  run_inproc(4, [&](int r, inproc_transport t) {
    halving_doubling<inproc_transport> c(std::move(t), with_timeout(20s));
    std::vector<double> v(1000, 1.0);
    if (r == 3) return;  // leaves the group without taking part: its endpoint is destroyed
    std::error_code ec;
    c.allreduce(std::span(v), reduce_op::sum, ec);
    codes[static_cast<std::size_t>(r)] = ec;
    msgs[static_cast<std::size_t>(r)] = c.last_error();
  });
  CHECK(std::chrono::steady_clock::now() - start < 2s);  // at once, not at the 20 s deadline
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r << ": " << msgs[static_cast<std::size_t>(r)]);
    CHECK(codes[static_cast<std::size_t>(r)]);
  }
  // Rank 2 exchanges with rank 3 directly; its error names it.
  CHECK(codes[2] == errc::peer_lost);
  CHECK(has(msgs[2], "rank 3 left the group"));
}

TEST_CASE("errors: after a failure the communicator refuses further calls", "[collective][errors]") {
  run_inproc(2, [&](int r, inproc_transport t) {
    ring<inproc_transport> c(std::move(t), with_timeout(100ms));
    std::vector<float> v(8, 1.0f);
    if (r == 1) {
      std::this_thread::sleep_for(300ms);
      return;
    }
    std::error_code ec;
    c.allreduce(std::span(v), reduce_op::sum, ec);
    TCHECK(ec == errc::timeout);
    TCHECK(c.broken());
    try {
      c.barrier();
      TFAIL("a broken communicator ran a collective");
    } catch (const error& e) {
      TCHECK(e.code() == errc::broken);
      TCHECK(has(e.what(), "build a new communicator"));
    }
  });
}

TEST_CASE("errors: invalid arguments are typed errors raised before any communication",
          "[collective][errors]") {
  run_inproc(1, [&](int, inproc_transport t) {
    communicator<inproc_transport> c(std::move(t));
    std::vector<float> a(10), b(7);
    std::error_code ec;
    c.allreduce<float>(a, std::span(b), reduce_op::sum, ec);
    TCHECK(ec == errc::invalid_argument);
    TCHECK(has(c.last_error(), "allreduce: in and out must have equal sizes"));
    c.broadcast(std::span(a), 3, ec);
    TCHECK(ec == errc::invalid_argument);
    c.allreduce<float>(std::span(a).first(6), std::span(a).last(6), reduce_op::sum, ec);
    TCHECK(ec == errc::invalid_argument);
    TCHECK(has(c.last_error(), "overlap"));
    c.reduce_scatter<float>(a, std::span(b), reduce_op::sum, ec);
    TCHECK(ec == errc::invalid_argument);
    TCHECK_FALSE(c.broken());  // nothing was sent, so the group is still consistent
    TCHECK(c.sequence() == 0);
    c.allreduce(std::span(a), reduce_op::sum, ec);
    TCHECK_FALSE(ec);
  });
}

TEST_CASE("errors: the throwing forms throw dtrain::error with the same code", "[collective][errors]") {
  run_inproc(2, [&](int r, inproc_transport t) {
    communicator<inproc_transport> c(std::move(t), with_timeout(200ms));
    std::vector<int> v(4);
    if (r == 1) return;
    try {
      c.allgather(std::span(v));
      TFAIL("no error");
    } catch (const error& e) {
      TCHECK((e.code() == errc::peer_lost || e.code() == errc::timeout));
      TCHECK(has(e.what(), "allgather #0"));
    }
  });
}
