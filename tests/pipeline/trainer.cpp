// Pipeline trainers against serial training: with fp64 and the same micro-batches, GPipe (with and
// without re-materialisation), 1F1B and interleaved 1F1B leave the parameters bit for bit where
// serial mini-batch training with gradient accumulation does, and PipeDream where its
// weight-stashing equations do; p = 1..4 stages, m = 1..16 micro-batches, in-process. The
// partitioner against brute force, and a mismatch between two ranks' schedules named.

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "../catch.hpp"
#include "dtrain/collective/communicator.hpp"
#include "dtrain/pipeline/partition.hpp"
#include "dtrain/transport/group.hpp"
#include "dtrain/transport/mesh.hpp"
#include "dtrain/transport/inproc.hpp"
#include "dtrain/updater/adam.hpp"
#include "dtrain/updater/sgd.hpp"
#include "pipeline_case.hpp"

using namespace dtrain;
using dtrain::testing::case_result;

namespace {

template <class Schedule, class Updater>
void check_exact(const Schedule& schedule, const Updater& updater, int max_ranks) {
  for (int p = 1; p <= max_ranks; ++p) {
    for (int m : {1, 2, 3, 5, 8, 16}) {
      std::atomic<int> wrong{0};
      std::string first;
      std::mutex mu;
      run_inproc(p, [&](int, inproc_transport t) {
        const case_result r = testing::run_pipeline_case(std::move(t), schedule, updater, m, 3);
        wrong += r.wrong;
        std::lock_guard lock(mu);
        if (r.wrong > 0 && first.empty()) first = r.first;
      });
      INFO(Schedule::name << " p " << p << " m " << m << ": " << first);
      CHECK(wrong.load() == 0);
    }
  }
}

}  // namespace

TEST_CASE("pipeline: flushed schedules equal serial gradient accumulation bit for bit", "[pipeline]") {
  check_exact(pipeline::gpipe{}, sgd<double>(0.1), 4);
  check_exact(pipeline::gpipe{true}, adam<double>(0.01), 4);
  check_exact(pipeline::one_f_one_b{}, adam<double>(0.01), 4);
  check_exact(pipeline::interleaved_one_f_one_b{2}, sgd<double>(0.1), 4);
  check_exact(pipeline::interleaved_one_f_one_b{3}, adam<double>(0.01), 2);
}

TEST_CASE("pipeline: pipedream equals its weight-stashing equations bit for bit", "[pipeline]") {
  check_exact(pipeline::pipedream{}, sgd<double>(0.1), 4);
  check_exact(pipeline::pipedream{}, adam<double>(0.01), 4);
}

namespace {

// The test stage, counting the most micro-batches whose activations it held at once.
struct counting_stage : testing::mlp_stage<double> {
  using mlp_stage::mlp_stage;
  std::size_t most_kept = 0;
  double forward(const micro_batch& mb, std::span<const double> in, std::span<double> out) {
    const double loss = mlp_stage::forward(mb, in, out);
    most_kept = std::max(most_kept, kept());
    return loss;
  }
};

}  // namespace

TEST_CASE("pipeline: GPipe keeps m micro-batches' activations, re-materialised one; 1F1B p - r", "[pipeline]") {
  const int m = 6;
  for (int schedule = 0; schedule < 3; ++schedule) {
    std::vector<std::size_t> most(2);
    run_inproc(2, [&](int r, inproc_transport t) {
      const auto widths = testing::test_widths();
      const auto bounds = pipeline::uniform_partition(widths.size() - 1, 2);
      std::vector<counting_stage> chunk;
      chunk.emplace_back(widths, bounds[r], bounds[r + 1], testing::test_batch);
      pipeline::trainer_options o;
      o.micro_batches = m;
      if (schedule < 2) {
        pipeline::trainer<inproc_transport, pipeline::gpipe, sgd<double>, counting_stage> tr(
            std::move(t), std::move(chunk), sgd<double>(0.1), pipeline::gpipe{schedule == 1}, o);
        tr.step();
        most[r] = tr.chunks()[0].most_kept;
      } else {
        pipeline::trainer<inproc_transport, pipeline::one_f_one_b, sgd<double>, counting_stage> tr(
            std::move(t), std::move(chunk), sgd<double>(0.1), {}, o);
        tr.step();
        most[r] = tr.chunks()[0].most_kept;
      }
    });
    INFO("schedule " << schedule);
    if (schedule == 0) CHECK(most == std::vector<std::size_t>{m, m});
    if (schedule == 1) CHECK(most == std::vector<std::size_t>{1, 1});
    if (schedule == 2) CHECK(most == std::vector<std::size_t>{2, 1});
  }
}

TEST_CASE("pipeline: balanced partition is optimal against brute force", "[pipeline]") {
  const std::vector<double> costs{3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
  for (int k = 1; k <= 6; ++k) {
    const auto bounds = pipeline::balanced_partition(costs, k);
    REQUIRE(bounds.size() == static_cast<std::size_t>(k + 1));
    // Every way to cut 10 layers into k non-empty stages: choose k - 1 cut points of 9.
    double best = 1e300;
    for (unsigned mask = 0; mask < (1u << 9); ++mask) {
      if (__builtin_popcount(mask) != k - 1) continue;
      pipeline::partition b{0};
      for (int i = 0; i < 9; ++i) {
        if (mask & (1u << i)) b.push_back(i + 1);
      }
      b.push_back(10);
      best = std::min(best, pipeline::slowest_stage(costs, b));
    }
    INFO("k " << k);
    CHECK(pipeline::slowest_stage(costs, bounds) == best);
  }
  CHECK(pipeline::uniform_partition(10, 4) == pipeline::partition{0, 3, 6, 8, 10});
  CHECK_THROWS_AS(pipeline::uniform_partition(3, 4), dtrain::error);
}

TEST_CASE("pipeline: two ranks running different partitions fail naming the message", "[pipeline]") {
  std::atomic<int> named{0};
  CHECK_THROWS(run_inproc(2, [&](int r, inproc_transport t) {
    const auto widths = testing::test_widths();
    // Rank 0 thinks stage 0 ends after layer 4, rank 1 that stage 1 starts at layer 3: the
    // activation's width differs (batch x 8 against batch x 6).
    std::vector<testing::mlp_stage<double>> chunk;
    chunk.emplace_back(widths, r == 0 ? 0 : 3, r == 0 ? 4 : 8, testing::test_batch);
    pipeline::trainer_options o;
    o.micro_batches = 2;
    o.executor.timeout = std::chrono::seconds(10);
    pipeline::trainer<inproc_transport, pipeline::one_f_one_b, sgd<double>, testing::mlp_stage<double>> tr(
        std::move(t), std::move(chunk), sgd<double>(0.1), {}, o);
    try {
      tr.step();
    } catch (const dtrain::error& e) {
      const std::string what = e.what();
      if (what.find("activation of micro-batch 0 into stage 1") != std::string::npos && what.find("24 elements") != std::string::npos) ++named;
      throw;
    }
  }));
  CHECK(named.load() == 1);
}

namespace {

template <class Schedule>
void check_replicated(const Schedule& schedule, bool overlap) {
  using group = process_group<inproc_transport>;
  for (int dp : {2, 3}) {
    for (int pp = 1; pp <= 3; ++pp) {
      for (int m : {1, 4}) {
        std::atomic<int> wrong{0};
        std::string first;
        std::mutex mu;
        run_inproc(dp * pp, [&](int, inproc_transport t) {
          device_mesh<inproc_transport> mesh(group(std::move(t)), {{"dp", dp}, {"pp", pp}});
          communicator<group> replicas(mesh.group("dp"));
          const case_result r = testing::run_pipeline_case(mesh.group("pp"), schedule, adam<double>(0.01), m, 3,
                                                           std::move(replicas), mesh.coordinate("dp"), overlap);
          wrong += r.wrong;
          std::lock_guard lock(mu);
          if (r.wrong > 0 && first.empty()) first = r.first;
        });
        INFO(Schedule::name << (overlap ? " overlapped" : "") << " dp " << dp << " pp " << pp << " m " << m << ": " << first);
        CHECK(wrong.load() == 0);
      }
    }
  }
}

}  // namespace

TEST_CASE("pipeline: data-parallel replicas of a pipeline along a mesh equal serial training", "[pipeline]") {
  check_replicated(pipeline::interleaved_one_f_one_b{2}, true);
  check_replicated(pipeline::one_f_one_b{}, false);
  check_replicated(pipeline::gpipe{}, true);
  check_replicated(pipeline::pipedream{}, true);
}
