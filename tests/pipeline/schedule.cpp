// Every schedule, executed serially for p = 1..8 ranks, v = 1..3 chunks, m = 1..32 micro-batches:
// every receive finds its message in order, each micro-batch runs forward before backward once
// on every stage, and the bubble and live activations are the closed forms the docs state.

#include <algorithm>
#include <cmath>
#include <string>

#include "../catch.hpp"
#include "dtrain/pipeline/schedule.hpp"
#include "dtrain/pipeline/simulate.hpp"

namespace pl = dtrain::pipeline;

namespace {

template <class Schedule>
void check_sound_everywhere(const Schedule& schedule) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 32; ++m) {
      const pl::simulation sim = pl::simulate(schedule, p, m);
      INFO(std::string(Schedule::name) << " p " << p << " v " << schedule.chunks() << " m " << m);
      REQUIRE(sim.problem == "");
    }
  }
}

int count(const std::vector<pl::action>& actions, pl::action_kind kind) {
  return static_cast<int>(
      std::count_if(actions.begin(), actions.end(), [&](const pl::action& a) { return a.kind == kind; }));
}

}  // namespace

TEST_CASE("every schedule is sound for p 1-8, v 1-3, m 1-32", "[pipeline]") {
  check_sound_everywhere(pl::gpipe{});
  check_sound_everywhere(pl::one_f_one_b{});
  check_sound_everywhere(pl::pipedream{});
  for (int v = 1; v <= 3; ++v) check_sound_everywhere(pl::interleaved_one_f_one_b{v});
}

TEST_CASE("the simulator catches a deadlock, a wrong order and a backward before its forward", "[pipeline]") {
  const pl::pipeline_shape shape{2, 1, 2};
  std::vector<std::vector<pl::action>> plan{pl::one_f_one_b{}.actions(0, shape), pl::one_f_one_b{}.actions(1, shape)};
  using k = pl::action_kind;

  SECTION("rank 1 waits for a gradient nobody sends first") {
    auto bad = plan;
    bad[1].insert(bad[1].begin(), {k::recv_gradient, 0, 0});
    CHECK(pl::simulate(bad, shape).problem.find("deadlock: rank 0 at recv_gradient mb 0") != std::string::npos);
  }
  SECTION("rank 1 receives micro-batch 1 before 0") {
    auto bad = plan;
    std::vector<pl::action*> receives;
    for (auto& a : bad[1]) {
      if (a.kind == k::recv_activation) receives.push_back(&a);
    }
    REQUIRE(receives.size() == 2);
    std::swap(receives[0]->mb, receives[1]->mb);
    CHECK(pl::simulate(bad, shape).problem.find("carries micro-batch 0") != std::string::npos);
  }
  SECTION("a two-rank cycle: each receives before it sends") {
    std::vector<std::vector<pl::action>> cycle{{{k::forward, 0, 0},
                                                {k::recv_gradient, 0, 0},
                                                {k::send_activation, 0, 0},
                                                {k::backward, 0, 0},
                                                {k::optimizer_step, 0, 0}},
                                               {{k::recv_activation, 0, 0},
                                                {k::forward, 0, 0},
                                                {k::backward, 0, 0},
                                                {k::send_gradient, 0, 0},
                                                {k::optimizer_step, 0, 0}}};
    const auto sim = pl::simulate(cycle, pl::pipeline_shape{2, 1, 1});
    CHECK(sim.problem.find("deadlock") != std::string::npos);
    CHECK(sim.problem.find("rank 0 at recv_gradient mb 0") != std::string::npos);
  }
  SECTION("a backward before its forward") {
    std::vector<std::vector<pl::action>> early{{{k::backward, 0, 0}, {k::forward, 0, 0}, {k::optimizer_step, 0, 0}}};
    CHECK(pl::simulate(early, pl::pipeline_shape{1, 1, 1}).problem.find("before its forward") != std::string::npos);
  }
  SECTION("a micro-batch left out") {
    std::vector<std::vector<pl::action>> missing{{{k::forward, 0, 0}, {k::backward, 0, 0}, {k::optimizer_step, 1, 0}}};
    CHECK(pl::simulate(missing, pl::pipeline_shape{1, 1, 2}).problem.find("not once each") != std::string::npos);
  }
}

TEST_CASE("interleaved warm-up is Megatron's when p divides m, and only raised where it must be", "[pipeline]") {
  for (int v = 1; v <= 3; ++v) {
    const pl::interleaved_one_f_one_b schedule{v};
    for (int p = 1; p <= 8; ++p) {
      for (int m = p; m <= 32; m += p) {
        const std::vector<int> warmup = schedule.warmups(p, m);
        for (int r = 0; r < p; ++r) {
          INFO("v " << v << " p " << p << " m " << m << " rank " << r);
          CHECK(warmup[r] == std::min(2 * (p - r - 1) + (v - 1) * p, v * m));
        }
      }
    }
  }
  // p = 5, v = 2, m = 7: Megatron's count deadlocks (rank 4 waits on a gradient of micro-batch 0
  // that rank 0 sends only after a forward rank 4 has not run), the raised one does not.
  const pl::interleaved_one_f_one_b schedule{2};
  CHECK(schedule.warmups(5, 7) != std::vector<int>{13, 11, 9, 7, 5});
  CHECK(pl::simulate(schedule, 5, 7).ok());
}

TEST_CASE("flushed schedules step once at the end, pipedream after every backward", "[pipeline]") {
  for (int p = 1; p <= 4; ++p) {
    const pl::pipeline_shape shape{p, 1, 8};
    for (int r = 0; r < p; ++r) {
      CHECK(count(pl::gpipe{}.actions(r, shape), pl::action_kind::optimizer_step) == 1);
      CHECK(count(pl::one_f_one_b{}.actions(r, shape), pl::action_kind::optimizer_step) == 1);
      CHECK(pl::one_f_one_b{}.actions(r, shape).back().kind == pl::action_kind::optimizer_step);
      CHECK(count(pl::pipedream{}.actions(r, shape), pl::action_kind::optimizer_step) == 8);
    }
  }
}

TEST_CASE("bubble fractions match the closed forms with balanced stages", "[pipeline]") {
  for (int p : {2, 3, 4, 8}) {
    for (int m : {1, 4, 8, 16, 32}) {
      INFO("p " << p << " m " << m);
      const pl::step_costs costs{1.0, 2.0, 0.0};
      CHECK(std::abs(pl::simulate(pl::gpipe{}, p, m, costs).bubble() - pl::bubble_fraction(p, m)) < 1e-12);
      CHECK(std::abs(pl::simulate(pl::one_f_one_b{}, p, m, costs).bubble() - pl::bubble_fraction(p, m)) < 1e-12);
      if (m % p == 0) {
        for (int v : {2, 3}) {
          // Each chunk holds 1/v of the rank's layers, so it costs 1/v as much.
          const pl::step_costs chunk{1.0 / v, 2.0 / v, 0.0};
          INFO("v " << v);
          CHECK(std::abs(pl::simulate(pl::interleaved_one_f_one_b{v}, p, m, chunk).bubble() -
                         pl::bubble_fraction(p, m, v)) < 1e-12);
        }
      }
    }
  }
}

TEST_CASE("peak live activations: gpipe grows with m, 1F1B with p", "[pipeline]") {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 32; ++m) {
      const auto g = pl::simulate(pl::gpipe{}, p, m);
      const auto f = pl::simulate(pl::one_f_one_b{}, p, m);
      for (int r = 0; r < p; ++r) {
        INFO("p " << p << " m " << m << " rank " << r);
        CHECK(g.peak_live[r] == m);
        CHECK(f.peak_live[r] == std::min(p - r, m));
      }
      for (int v = 2; v <= 3; ++v) {
        const pl::interleaved_one_f_one_b schedule{v};
        const auto i = pl::simulate(schedule, p, m);
        for (int r = 0; r < p; ++r) {
          INFO("p " << p << " m " << m << " v " << v << " rank " << r);
          CHECK(i.peak_live[r] == std::min(schedule.warmups(p, m)[r] + 1, v * m));
        }
      }
    }
  }
}
