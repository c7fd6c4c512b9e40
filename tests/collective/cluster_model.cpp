// cluster_model against closed forms worked by hand: a ring inside one host and across hosts,
// halving-doubling whose largest exchanges share the host links, the pipelined trees' fill and
// stages, and the two-level allreduce's pipeline; and the choices that follow from them.

#include <cmath>

#include "../catch.hpp"
#include "dtrain/collective/cluster_model.hpp"

using namespace dtrain;

namespace {

// Round numbers: 10 us and 1 GB/s inside a host, 100 us and 0.1 GB/s between hosts, 2 GB/s reduction.
constexpr two_level_costs costs{10e-6, 1e-9, 100e-6, 1e-8, 0.5e-9};
constexpr double mb = 1 << 20;

bool near(double got, double want) { return std::abs(got - want) <= 1e-9 + 1e-9 * std::abs(want); }

}  // namespace

TEST_CASE("cluster_model: a ring inside one host and across hosts", "[collective][model]") {
  // One host of 4: 6 steps of n/4 at the local constants, 3/4 of n reduced.
  const cluster_model one(costs, {1, 4});
  const double n = 4 * mb;
  CHECK(near(one.flat(algorithm::ring, n), 6 * (10e-6 + mb * 1e-9) + 0.75 * n * 0.5e-9));
  // 2 hosts x 2: every step waits for the one message that crosses each host's link.
  const cluster_model two(costs, {2, 2});
  CHECK(near(two.flat(algorithm::ring, n), 6 * (100e-6 + mb * 1e-8) + 0.75 * n * 0.5e-9));
  // A block of 2 segments: alpha twice per step.
  const cluster_model segmented(costs, {2, 2}, mb / 2);
  CHECK(near(segmented.flat(algorithm::ring, n), 6 * (200e-6 + mb * 1e-8) + 0.75 * n * 0.5e-9));
  CHECK(one.flat(algorithm::ring, 0) == one.flat(algorithm::ring, 0));
  CHECK(cluster_model(costs, {1, 1}).flat(algorithm::ring, n) == 0);
}

TEST_CASE("cluster_model: halving-doubling's first exchanges share each host's link", "[collective][model]") {
  // 2 hosts x 4: at distance 4 all 4 ranks of a host exchange n/2 across at once (4 n/2 on the
  // link), at distances 2 and 1 n/4 and n/8 inside; the allgather mirrors it without reducing.
  const cluster_model m(costs, {2, 4});
  const double n = 8 * mb;
  const double across = 100e-6 + 4 * (n / 2) * 1e-8, d2 = 10e-6 + n / 4 * 1e-9, d1 = 10e-6 + n / 8 * 1e-9;
  const double reduced = (n / 2 + n / 4 + n / 8) * 0.5e-9;
  CHECK(near(m.flat(algorithm::halving_doubling, n), 2 * (across + d2 + d1) + reduced));
  // Recursive doubling: the whole vector at distances 1, 2 (inside) and 4 (across, shared).
  CHECK(near(m.flat(algorithm::recursive_doubling, n),
             2 * (10e-6 + n * 1e-9) + 100e-6 + 4 * n * 1e-8 + 3 * n * 0.5e-9));
  // 6 ranks: the fold (ranks 0-3 pair up inside the hosts of 3: 0->1 inside, 2->3 across) first.
  const cluster_model six(costs, {2, 3});
  CHECK(six.flat(algorithm::halving_doubling, n) > cluster_model(costs, {2, 2}).flat(algorithm::halving_doubling, n));
}

TEST_CASE("cluster_model: pipelined trees pay a stage per segment and a hop per level", "[collective][model]") {
  // Binomial over 2 ranks on 2 hosts, 4 segments of 1 MiB: reduce 3 stages + 1 hop (each
  // alpha + seg beta + seg gamma), then broadcast the same without gamma.
  const cluster_model m(costs, {2, 1});
  const double n = 4 * mb, hop = 100e-6 + mb * 1e-8;
  CHECK(near(m.flat(algorithm::binomial_tree, n), 4 * (hop + mb * 0.5e-9) + 4 * hop));
  // Binomial over 2 hosts x 2, one segment: the longest path from the root, 0 -> 2 -> 3, crosses
  // once and stays inside once, each way (reducing on the way up).
  const cluster_model four(costs, {2, 2});
  CHECK(near(four.flat(algorithm::binomial_tree, mb),
             2 * (100e-6 + mb * 1e-8) + 2 * (10e-6 + mb * 1e-9) + 2 * mb * 0.5e-9));
  // Double tree on 2 ranks: each tree carries n/2 in 2 segments, up and down at once over the
  // one edge of each tree, so each rank sends 2 segments across per stage (2 alphas, 2 segments
  // on the link) and reduces 1 (its child in the tree where it is the root); the fill is one hop
  // up (reducing) and one down.
  CHECK(near(m.flat(algorithm::double_binary_tree, n),
             (2 * 100e-6 + 2 * mb * 1e-8 + mb * 0.5e-9) + (hop + mb * 0.5e-9) + hop));
}

TEST_CASE("cluster_model: the two-level pipeline and the choices it leads to", "[collective][model]") {
  const cluster_model m(costs, {2, 4}, mb, 4 * mb);
  // 16 MiB in 4 chunks of 4 MiB: reduce-scatter and allgather rings of 3 steps of 1 MiB inside,
  // across by the fastest algorithm over 2 hosts whose link carries 4 allreduces of 1 MiB at once.
  const double inside = 3 * (10e-6 + mb * 1e-9);
  const double scatter = inside + 0.75 * 4 * mb * 0.5e-9, gather = inside;
  two_level_costs shared = costs;
  shared.beta_cross *= 4;
  const cluster_model across(shared, {2, 1});
  const double a = across.flat(m.across_algorithm(16 * mb), mb);
  CHECK(near(m.two_levels(16 * mb), scatter + a + gather + 3 * std::max(scatter + gather, a)));
  // A call's fixed cost: once per flat allreduce, three times per chunk of the two levels.
  two_level_costs with_calls = costs;
  with_calls.call = 7e-6;
  const cluster_model called(with_calls, {2, 4}, mb, 4 * mb);
  CHECK(near(called.flat(algorithm::ring, 16 * mb), m.flat(algorithm::ring, 16 * mb) + 7e-6));
  CHECK(near(called.two_levels(1 * mb), m.two_levels(1 * mb) + 3 * 7e-6));
  CHECK(std::isinf(cluster_model(costs, {1, 8}).two_levels(16 * mb)));
  CHECK(std::isinf(cluster_model(costs, {8, 1}).two_levels(16 * mb)));
  // Large: two levels beat every flat algorithm, and the flat ring beats halving-doubling,
  // whose exchanges across share the link four ways.
  CHECK(m.two_levels(64 * mb) < 0.7 * m.flat(m.best_flat(64 * mb), 64 * mb));
  CHECK(m.best_flat(64 * mb) == algorithm::ring);
  // Tiny: a logarithmic number of steps wins over 2(P-1) ring steps.
  CHECK(m.best_flat(8) != algorithm::ring);
  CHECK(cluster_model(costs, {64, 1}).best_flat(8) == algorithm::recursive_doubling);
}
