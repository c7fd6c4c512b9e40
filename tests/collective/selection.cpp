#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "../catch.hpp"
#include "dtrain/transport/inproc.hpp"
#include "dtrain/collective/communicator.hpp"
#include "dtrain/collective/selection.hpp"
#include "../support/thread_checks.hpp"

using namespace dtrain;

TEST_CASE("selection: the cost model picks latency-optimal algorithms for small messages and "
          "bandwidth-optimal ones for large", "[collective][selection]") {
  selection_table t;
  // Small allreduce on 8 ranks: recursive doubling (log p messages) beats the ring's 2(p-1).
  CHECK(t.choose(coll_op::allreduce, 64, 8) == algorithm::recursive_doubling);
  // Large allreduce: a bandwidth-optimal algorithm (2(p-1)/p n bytes), never the tree.
  auto big = t.choose(coll_op::allreduce, 64u << 20, 8);
  CHECK((big == algorithm::ring || big == algorithm::halving_doubling));
  // Non-power-of-two world: halving-doubling pays for the fold; the ring does not.
  CHECK(t.choose(coll_op::allreduce, 64u << 20, 7) == algorithm::ring);
  CHECK(t.choose(coll_op::allgather, 256, 9) == algorithm::bruck);
  CHECK(t.choose(coll_op::allgather, 64u << 20, 9) == algorithm::ring);
  CHECK(t.choose(coll_op::broadcast, 64, 9) == algorithm::binomial_tree);
  CHECK(t.choose(coll_op::broadcast, 256u << 20, 4) == algorithm::ring);
  CHECK(t.choose(coll_op::alltoall, 64, 8) == algorithm::linear);
  CHECK(t.choose(coll_op::alltoall, 64u << 20, 8) == algorithm::pairwise);
  CHECK(t.choose(coll_op::barrier, 0, 5) == algorithm::dissemination);
  for (int op = 0; op <= static_cast<int>(coll_op::barrier); ++op) {
    for (int p : {1, 2, 3, 9, 64}) {
      for (std::size_t bytes : {std::size_t{0}, std::size_t{1000}, std::size_t{1} << 30}) {
        auto a = t.choose(static_cast<coll_op>(op), bytes, p);
        REQUIRE(supports(static_cast<coll_op>(op), a));
      }
    }
  }
}

TEST_CASE("selection: the model's estimates follow the alpha-beta formulas", "[collective][selection]") {
  cost_model m;
  m.alpha = 1e-5;
  m.beta = 1e-9;
  m.gamma = 0;
  m.segment_bytes = 1e18;  // one segment
  const double n = 1e6;
  // Ring allreduce: 2(p-1) messages and 2(p-1)/p n bytes.
  CHECK(m.estimate(coll_op::allreduce, algorithm::ring, n, 4) == Approx(6e-5 + 1.5e-3));
  // Halving-doubling on a power of two: 2 log2 p messages, same bytes.
  CHECK(m.estimate(coll_op::allreduce, algorithm::halving_doubling, n, 4) == Approx(4e-5 + 1.5e-3));
  // Binomial broadcast: ceil(log2 p) full-size messages.
  CHECK(m.estimate(coll_op::broadcast, algorithm::binomial_tree, n, 5) == Approx(3 * (1e-5 + 1e-3)));
  CHECK(std::isinf(m.estimate(coll_op::allreduce, algorithm::bruck, n, 4)));
  // Past 256 MiB a whole-vector send is several messages: recursive doubling of 1 GiB on 4 ranks
  // sends 4 per step, halving-doubling 2 + 2 + 1 + 1 (halves of 512 MiB, quarters of 256 MiB).
  const double gib = double(std::size_t{1} << 30);
  CHECK(m.estimate(coll_op::allreduce, algorithm::recursive_doubling, gib, 4) == Approx(2 * (4e-5 + gib * 1e-9)));
  CHECK(m.estimate(coll_op::allreduce, algorithm::halving_doubling, gib, 4) == Approx(2 * 3e-5 + 1.5 * gib * 1e-9));
}

TEST_CASE("selection: where each rank has a core to spare, the ring's reduction overlaps its "
          "transfers and the ring wins large allreduces", "[collective][selection]") {
  cost_model m;
  m.alpha = 1e-5;
  m.beta = 1e-9;
  m.gamma = 1e-9;
  m.segment_bytes = 1e6;
  const double n = 16e6;  // blocks of 4e6 bytes on 4 ranks: 4 segments each
  // Unhidden, the ring and halving-doubling reduce the same 3/4 n; the ring sends more messages.
  CHECK(m.estimate(coll_op::allreduce, algorithm::ring, n, 4) == Approx(24e-5 + 24e-3 + 12e-3));
  CHECK(m.estimate(coll_op::allreduce, algorithm::halving_doubling, n, 4) == Approx(4e-5 + 24e-3 + 12e-3));
  CHECK(m.estimate(coll_op::reduce_scatter, algorithm::ring, n, 4) == Approx(12e-5 + 12e-3 + 12e-3));
  // Overlapped, one segment's reduction per step is left: 3 steps of 1e6 bytes.
  m.reduction_overlaps = true;
  CHECK(m.estimate(coll_op::allreduce, algorithm::ring, n, 4) == Approx(24e-5 + 24e-3 + 3e-3));
  CHECK(m.estimate(coll_op::reduce_scatter, algorithm::ring, n, 4) == Approx(12e-5 + 12e-3 + 3e-3));
  CHECK(m.estimate(coll_op::allreduce, algorithm::halving_doubling, n, 4) == Approx(4e-5 + 24e-3 + 12e-3));
  // A block of one segment has nothing to overlap: the estimate is the unhidden one.
  CHECK(m.estimate(coll_op::allreduce, algorithm::ring, 4e6, 4) == Approx(6e-5 + 6e-3 + 3e-3));

  // With the default constants: halving-doubling for a 16 MiB allreduce on 2 and 4 ranks
  // without the overlap, the ring with it; 1 MiB stays with halving-doubling (one segment).
  selection_table t;
  CHECK(t.choose(coll_op::allreduce, 16u << 20, 2) == algorithm::halving_doubling);
  CHECK(t.choose(coll_op::allreduce, 16u << 20, 4) == algorithm::halving_doubling);
  t.model().reduction_overlaps = true;
  CHECK(t.choose(coll_op::allreduce, 16u << 20, 2) == algorithm::ring);
  CHECK(t.choose(coll_op::allreduce, 16u << 20, 4) == algorithm::ring);
  CHECK(t.choose(coll_op::allreduce, 1u << 20, 4) == algorithm::halving_doubling);
  CHECK(t.choose(coll_op::reduce_scatter, 16u << 20, 4) == algorithm::ring);
}

TEST_CASE("selection: user rules override the model, first match wins", "[collective][selection]") {
  selection_table t;
  t.add({coll_op::allreduce, algorithm::binomial_tree, 0, 1024});
  t.force(coll_op::allreduce, algorithm::halving_doubling);
  CHECK(t.choose(coll_op::allreduce, 100, 4) == algorithm::binomial_tree);
  CHECK(t.choose(coll_op::allreduce, 1u << 20, 4) == algorithm::halving_doubling);
  CHECK(t.choose(coll_op::allreduce, 1u << 20, 7) == algorithm::halving_doubling);
  CHECK_THROWS_AS(t.force(coll_op::allreduce, algorithm::bruck), error);
}

TEST_CASE("selection: rules parse from text, and bad text is a clear error", "[collective][selection]") {
  selection_table t;
  t.parse("allreduce=ring,allreduce[0-4096]=recursive_doubling,alltoall[1048576]=pairwise");
  CHECK(t.choose(coll_op::allreduce, 100, 4) == algorithm::recursive_doubling);
  CHECK(t.choose(coll_op::allreduce, 1u << 20, 4) == algorithm::ring);
  CHECK(t.choose(coll_op::alltoall, 2u << 20, 4) == algorithm::pairwise);
  try {
    selection_table().parse("allreduce=bruck");
    FAIL("accepted an algorithm that does not implement the op");
  } catch (const error& e) {
    CHECK(e.code() == errc::invalid_argument);
    CHECK(std::string(e.what()).find("bruck does not implement allreduce") != std::string::npos);
  }
  CHECK_THROWS_AS(selection_table().parse("allreduce"), error);
  CHECK_THROWS_AS(selection_table().parse("allreduse=ring"), error);
  CHECK_THROWS_AS(selection_table().parse("allreduce[x]=ring"), error);
  CHECK_THROWS_AS(selection_table().parse("allreduce=rong"), error);
}

TEST_CASE("selection: the family models prefer their algorithm, and calls carry it",
          "[collective][selection]") {
  run_inproc(3, [](int, inproc_transport t) {
    bruck<inproc_transport> c(std::move(t));
    TCHECK(c.options().algorithms.choose(coll_op::allgather, 1u << 30, 3) == algorithm::bruck);
    // Operations Bruck does not implement fall back to the model.
    TCHECK(supports(coll_op::allreduce, c.options().algorithms.choose(coll_op::allreduce, 8, 3)));
  });
}

TEST_CASE("selection: DTRAIN_ALGORITHMS overrides the code's choice", "[collective][selection]") {
  ::setenv("DTRAIN_ALGORITHMS", "allgather=ring", 1);
  run_inproc(2, [](int, inproc_transport t) {
    bruck<inproc_transport> c(std::move(t));
    TCHECK(c.options().algorithms.choose(coll_op::allgather, 10, 2) == algorithm::ring);
  });
  ::setenv("DTRAIN_ALGORITHMS", "allgather=bruck,", 1);
  run_inproc(2, [](int, inproc_transport t) {
    ring<inproc_transport> c(std::move(t));
    TCHECK(c.options().algorithms.choose(coll_op::allgather, 10, 2) == algorithm::bruck);
  });
  ::unsetenv("DTRAIN_ALGORITHMS");
}

TEST_CASE("selection: a call picks its allreduce algorithm, and ranks that pick differently are a mismatch naming both",
          "[collective][selection]") {
  // Every allreduce algorithm by name, on 5 ranks, against the closed form 1 + 2 + ... + 5.
  std::vector<std::string> seen(5);
  run_inproc(5, [&](int r, inproc_transport t) {
    communicator<inproc_transport> c(std::move(t));
    for (algorithm a : {algorithm::ring, algorithm::halving_doubling, algorithm::recursive_doubling,
                        algorithm::binomial_tree, algorithm::double_binary_tree}) {
      std::vector<double> v(1001, r + 1.0);
      c.allreduce(std::span(v), reduce_op::sum, a);
      TREQUIRE(v == std::vector<double>(1001, 15.0));
    }
    std::vector<float> v(4);
    try {
      c.allreduce(std::span(v), reduce_op::sum, algorithm::bruck);
    } catch (const error& e) {
      seen[static_cast<std::size_t>(r)] = e.what();
      TCHECK(e.code() == errc::invalid_argument);
    }
  });
  for (const auto& s : seen) CHECK(s.find("does not implement allreduce") != std::string::npos);
  std::vector<std::string> messages(2);
  run_inproc(2, [&](int r, inproc_transport t) {
    communicator_options o;
    o.timeout = std::chrono::seconds(20);
    communicator<inproc_transport> c(std::move(t), o);
    std::vector<float> v(100, 1.0f);
    try {
      c.allreduce(std::span(v), reduce_op::sum, r == 0 ? algorithm::ring : algorithm::recursive_doubling);
    } catch (const error& e) {
      messages[static_cast<std::size_t>(r)] = e.what();
    }
  });
  const bool named = messages[0].find("ring") != std::string::npos || messages[1].find("ring") != std::string::npos;
  CHECK(named);
  CHECK((messages[0] + messages[1]).find("recursive_doubling") != std::string::npos);
}
