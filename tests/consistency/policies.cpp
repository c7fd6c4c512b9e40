// The consistency models against their definitions, and a serial simulation of workers with
// random speeds checking the invariant each one promises.

#include <algorithm>
#include <random>
#include <vector>

#include "../catch.hpp"
#include "dtrain/concepts/consistency.hpp"
#include "dtrain/consistency/policies.hpp"

using namespace dtrain;

TEST_CASE("consistency: the bounds and apply counts of each model", "[consistency]") {
  CHECK(bsp{}.staleness_bound() == 0);
  CHECK(bsp{}.pushes_to_apply(4) == 4);
  CHECK(bsp{}.may_advance(3, 3));
  CHECK_FALSE(bsp{}.may_advance(4, 3));
  CHECK(asp{}.may_advance(1000, 0));
  CHECK(asp{}.pushes_to_apply(4) == 1);
  CHECK(ssp<2>{}.may_advance(5, 3));
  CHECK_FALSE(ssp<2>{}.may_advance(6, 3));
  CHECK(ssp<2>{}.visible_clock(10) == 7);
  CHECK(ssp<0>{}.staleness_bound() == bsp{}.staleness_bound());
  CHECK(soft_sync<3>{}.pushes_to_apply(8) == 3);
  CHECK(soft_sync<3>{}.pushes_to_apply(2) == 2);  // never more than there are workers
  CHECK(soft_sync<1>{}.pushes_to_apply(8) == asp{}.pushes_to_apply(8));
}

template <class C>
std::int64_t simulate_max_spread(int workers, int steps, unsigned seed) {
  // Each tick a random worker tries to finish its current clock; it may only if the model allows
  // its next clock given the slowest worker. Returns the largest spread of clocks seen.
  C c;
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> pick(0, workers - 1);
  std::vector<std::int64_t> clock(static_cast<std::size_t>(workers), 0);
  std::int64_t spread = 0;
  for (int t = 0; t < steps; ++t) {
    auto& mine = clock[static_cast<std::size_t>(pick(gen))];
    std::int64_t slowest = *std::min_element(clock.begin(), clock.end());
    if (c.may_advance(mine + 1, slowest)) ++mine;
    slowest = *std::min_element(clock.begin(), clock.end());
    spread = std::max(spread, *std::max_element(clock.begin(), clock.end()) - slowest);
  }
  return spread;
}

TEST_CASE("consistency: simulated workers never drift further than the bound", "[consistency]") {
  for (unsigned seed = 0; seed < 20; ++seed) {
    CHECK(simulate_max_spread<bsp>(5, 5000, seed) <= 1);  // one clock apart at a round boundary
    CHECK(simulate_max_spread<ssp<1>>(5, 5000, seed) <= 2);
    CHECK(simulate_max_spread<ssp<4>>(5, 5000, seed) <= 5);
  }
  // Without a bound, workers drift much further on the same schedules.
  std::int64_t asp_spread = 0;
  for (unsigned seed = 0; seed < 20; ++seed) {
    asp_spread = std::max(asp_spread, simulate_max_spread<asp>(5, 5000, seed));
  }
  CHECK(asp_spread > 5);
}
