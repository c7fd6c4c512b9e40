// Pipeline trainers against serial training: with fp64 and the same micro-batches, GPipe (with and
// without re-materialisation), 1F1B and interleaved 1F1B leave the parameters bit for bit where
// serial mini-batch training with gradient accumulation does, and PipeDream where its
// weight-stashing equations do; p = 1..4 stages, m = 1..16 micro-batches, in-process. The
// partitioner against brute force, and a mismatch between two ranks' schedules named.

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <unistd.h>

#include "../catch.hpp"
#include "dtrain/collective/communicator.hpp"
#include "dtrain/flight/recorder.hpp"
#include "dtrain/pipeline/partition.hpp"
#include "dtrain/topology/mesh.hpp"
#include "dtrain/transport/group.hpp"
#include "dtrain/transport/inproc.hpp"
#include "dtrain/updater/adam.hpp"
#include "dtrain/updater/sgd.hpp"
#include "../support/files.hpp"
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

TEST_CASE("pipeline: GPipe keeps m micro-batches' activations, re-materialised one, 1F1B p - r", "[pipeline]") {
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

namespace {

// Runs `body(rank, transport)` on 2 in-process ranks, each expected to throw; @returns how many
// ranks' errors contain `text`.
template <class Body>
int ranks_naming(const std::string& text, Body body) {
  std::atomic<int> named{0};
  CHECK_THROWS(run_inproc(2, [&](int r, inproc_transport t) {
    try {
      body(r, std::move(t));
    } catch (const dtrain::error& e) {
      if (std::string(e.what()).find(text) != std::string::npos) ++named;
      throw;
    }
  }));
  return named.load();
}

// Rank 0 thinks stage 0 ends after layer 4, rank 1 that stage 1 starts at layer 3: the activation
// between them is batch x 8 on one side and batch x 6 on the other.
std::vector<testing::mlp_stage<double>> misfit_chunk(int r) {
  std::vector<testing::mlp_stage<double>> chunk;
  chunk.emplace_back(testing::test_widths(), r == 0 ? 0 : 3, r == 0 ? 4 : 8, testing::test_batch);
  return chunk;
}

}  // namespace

TEST_CASE("pipeline: neighbours built with different partitions or schedules fail at construction, naming both",
          "[pipeline]") {
  pipeline::trainer_options o;
  o.micro_batches = 2;
  o.executor.timeout = std::chrono::seconds(10);
  using stage_t = testing::mlp_stage<double>;
  CHECK(ranks_naming("disagree on the activation between them: 18 elements expected here, 24 sent there",
                     [&](int r, inproc_transport t) {
                       pipeline::trainer<inproc_transport, pipeline::one_f_one_b, sgd<double>, stage_t> tr(
                           std::move(t), misfit_chunk(r), sgd<double>(0.1), {}, o);
                       tr.step();
                     }) == 1);
  const auto bounds = pipeline::uniform_partition(testing::test_widths().size() - 1, 2);
  CHECK(
      ranks_naming("run different schedules: one_f_one_b on 2 ranks x 1 chunks, 2 micro-batches here, gpipe on 2 ranks",
                   [&](int r, inproc_transport t) {
                     std::vector<stage_t> chunk;
                     chunk.emplace_back(testing::test_widths(), bounds[r], bounds[r + 1], testing::test_batch);
                     if (r == 0) {
                       pipeline::trainer<inproc_transport, pipeline::gpipe, sgd<double>, stage_t> tr(
                           std::move(t), std::move(chunk), sgd<double>(0.1), {}, o);
                       tr.step();
                     } else {
                       pipeline::trainer<inproc_transport, pipeline::one_f_one_b, sgd<double>, stage_t> tr(
                           std::move(t), std::move(chunk), sgd<double>(0.1), {}, o);
                       tr.step();
                     }
                   }) == 1);
}

TEST_CASE("pipeline: an activation that does not match its action fails the step naming both messages", "[pipeline]") {
  // The executors alone, without the trainer's handshake: the first activation's signature says
  // what differs.
  CHECK(ranks_naming(
            "expected the activation of micro-batch 0 into stage 1 (float64, 18 elements) from stage 0 (rank 0), "
            "got a message with the activation of micro-batch 0 into stage 1 (float64, 24 elements)",
            [&](int r, inproc_transport t) {
              auto chunk = misfit_chunk(r);
              pipeline::executor<inproc_transport, testing::mlp_stage<double>> ex(
                  t, std::span(chunk), {.timeout = std::chrono::seconds(10)});
              const pipeline::pipeline_shape shape{2, 1, 2};
              ex.run(pipeline::one_f_one_b{}.actions(r, shape), shape, 0,
                     {.optimizer_step = [](int) {}, .gradients_final = {}});
            }) == 1);
}

TEST_CASE("pipeline: after a failed step the trainer refuses to go on", "[pipeline]") {
  const auto bounds = pipeline::uniform_partition(testing::test_widths().size() - 1, 2);
  std::atomic<int> failed{0}, refused{0};
  CHECK_THROWS(run_inproc(2, [&](int r, inproc_transport t) {
    std::vector<testing::mlp_stage<double>> chunk;
    chunk.emplace_back(testing::test_widths(), bounds[r], bounds[r + 1], testing::test_batch);
    pipeline::trainer_options o;
    o.micro_batches = 2;
    o.executor.timeout = std::chrono::seconds(10);
    pipeline::trainer<inproc_transport, pipeline::one_f_one_b, sgd<double>, testing::mlp_stage<double>> tr(
        std::move(t), std::move(chunk), sgd<double>(0.1), {}, o);
    tr.step();
    if (r == 1) throw std::runtime_error("rank 1 leaves");  // its endpoint goes: rank 0's next step loses its peer
    try {
      tr.step();
    } catch (const dtrain::error&) {
      ++failed;
    }
    try {
      tr.step();
    } catch (const dtrain::error& e) {
      refused += e.code() == errc::broken;
    }
  }));
  CHECK(failed.load() == 1);
  CHECK(refused.load() == 1);
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
        std::vector<std::vector<std::byte>> bits(static_cast<std::size_t>(dp * pp));  // [replica * pp + stage rank]
        run_inproc(dp * pp, [&](int, inproc_transport t) {
          device_mesh<inproc_transport> mesh(group(std::move(t)), {{"dp", dp}, {"pp", pp}});
          communicator<group> replicas(mesh.group("dp"));
          case_result r = testing::run_pipeline_case(mesh.group("pp"), schedule, adam<double>(0.01), m, 3,
                                                     std::move(replicas), mesh.coordinate("dp"), overlap);
          bits[static_cast<std::size_t>(mesh.coordinate("dp") * pp + mesh.coordinate("pp"))] = std::move(r.bits);
          wrong += r.wrong;
          std::lock_guard lock(mu);
          if (r.wrong > 0 && first.empty()) first = r.first;
        });
        INFO(Schedule::name << (overlap ? " overlapped" : "") << " dp " << dp << " pp " << pp << " m " << m << ": "
                            << first);
        CHECK(wrong.load() == 0);
        // Data-parallel replicas hold the same bits, not just values near the serial run's.
        for (const auto& b : bits) REQUIRE(!b.empty());
        for (std::size_t i = static_cast<std::size_t>(pp); i < bits.size(); ++i) {
          INFO("replica " << i / pp << ", stage rank " << i % pp << " against replica 0");
          CHECK(bits[i] == bits[i % pp]);
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("pipeline: data-parallel replicas of a pipeline along a mesh equal serial training and hold the same bits",
          "[pipeline]") {
  check_replicated(pipeline::interleaved_one_f_one_b{2}, true);
  check_replicated(pipeline::one_f_one_b{}, false);
  check_replicated(pipeline::gpipe{}, true);
  check_replicated(pipeline::pipedream{}, true);
}

namespace {

using stage_t = testing::mlp_stage<double>;
template <class Schedule>
using trainer_t = pipeline::trainer<process_group<inproc_transport>, Schedule, adam<double>, stage_t>;

// This rank's chunks of the test network cut into `stages` stages at `bounds`.
std::vector<stage_t> chunks_for(int rank, int ranks, int v, const pipeline::partition& bounds) {
  std::vector<stage_t> chunks;
  for (int c = 0; c < v; ++c)
    chunks.emplace_back(testing::test_widths(), bounds[c * ranks + rank], bounds[c * ranks + rank + 1],
                        testing::test_batch);
  return chunks;
}

// This process's own file (another build's suite may run beside it); each test removes its files.
std::string checkpoint_path(const std::string& name, int rank) {
  const std::string file = "dtrain_pipeline_" + name + "." + std::to_string(::getpid()) + "." + std::to_string(rank);
  return (std::filesystem::temp_directory_path() / (file + ".ckpt")).string();
}

template <class Schedule>
void check_resume(const Schedule& schedule) {
  const int p = 2, v = schedule.chunks();
  const auto bounds = pipeline::uniform_partition(testing::test_widths().size() - 1, p * v);
  std::atomic<int> differ{0}, miscounted{0};
  run_inproc(p, [&](int r, inproc_transport t) {
    pipeline::trainer_options o;
    o.micro_batches = 3;
    process_group<inproc_transport> world(std::move(t));  // copies share the endpoint
    std::vector<double> straight;
    {
      trainer_t<Schedule> a(world, chunks_for(r, p, v, bounds), adam<double>(0.01), schedule, o);
      a.step();
      a.step();
      a.save(checkpoint_path(std::string(Schedule::name), r));
      a.step();
      a.step();
      for (auto& c : a.chunks()) {
        const auto f = testing::flat_parameters(c);
        straight.insert(straight.end(), f.begin(), f.end());
      }
    }
    trainer_t<Schedule> b(world, chunks_for(r, p, v, bounds), adam<double>(0.01), schedule, o);
    b.load(checkpoint_path(std::string(Schedule::name), r));
    std::filesystem::remove(checkpoint_path(std::string(Schedule::name), r));
    miscounted += b.steps() != 2;
    b.step();
    b.step();
    std::vector<double> resumed;
    for (auto& c : b.chunks()) {
      const auto f = testing::flat_parameters(c);
      resumed.insert(resumed.end(), f.begin(), f.end());
    }
    differ += resumed != straight;
  });
  INFO(Schedule::name);
  CHECK(miscounted.load() == 0);
  CHECK(differ.load() == 0);
}

}  // namespace

TEST_CASE("pipeline: a job resumed from its checkpoint continues bit for bit", "[pipeline][checkpoint]") {
  check_resume(pipeline::one_f_one_b{});
  check_resume(pipeline::interleaved_one_f_one_b{2});
  check_resume(pipeline::pipedream{});
}

TEST_CASE("pipeline: a checkpoint of another rank, partition, schedule or a corrupt one is refused, naming why",
          "[pipeline][checkpoint]") {
  const auto bounds = pipeline::uniform_partition(testing::test_widths().size() - 1, 2);
  std::vector<std::string> wrong;  // each way a refusal went wrong, checked on this thread
  run_inproc(1, [&](int, inproc_transport endpoint) {
    process_group<inproc_transport> t(std::move(endpoint));
    // A one-rank "pipeline" holding stage 0 of 2 is enough to write a file of rank 0.
    pipeline::trainer_options o;
    o.micro_batches = 2;
    trainer_t<pipeline::one_f_one_b> a(t, {stage_t(testing::test_widths(), 0, 8, testing::test_batch)},
                                       adam<double>(0.01), {}, o);
    a.step();
    const std::string path = checkpoint_path("refuse", 0);
    a.save(path);
    auto refused = [&](auto& trainer, const char* why) {
      const auto before = testing::flat_parameters(trainer.chunks()[0]);
      try {
        trainer.load(path);
        wrong.push_back(std::string(why) + ": loaded");
      } catch (const dtrain::error& e) {
        if (e.code() != errc::bad_data || std::string(e.what()).find(why) == std::string::npos)
          wrong.push_back(std::string(why) + ": " + e.what());
      }
      if (testing::flat_parameters(trainer.chunks()[0]) != before)
        wrong.push_back(std::string(why) + ": parameters changed");
    };
    trainer_t<pipeline::one_f_one_b> other_partition(t, {stage_t(testing::test_widths(), 0, 7, testing::test_batch)},
                                                     adam<double>(0.01), {}, o);
    refused(other_partition, "a different partition of the model?");
    trainer_t<pipeline::gpipe> other_schedule(t, {stage_t(testing::test_widths(), 0, 8, testing::test_batch)},
                                              adam<double>(0.01), {}, o);
    refused(other_schedule, "belongs to pipeline rank 0 of 1 (one_f_one_b");
    pipeline::trainer<process_group<inproc_transport>, pipeline::one_f_one_b, sgd<double>, stage_t> other_updater(
        t, {stage_t(testing::test_widths(), 0, 8, testing::test_batch)}, sgd<double>(0.1), {}, o);
    refused(other_updater, "was written with updater adam");
    pipeline::trainer_options more = o;
    more.micro_batches = 4;
    trainer_t<pipeline::one_f_one_b> other_m(t, {stage_t(testing::test_widths(), 0, 8, testing::test_batch)},
                                             adam<double>(0.01), {}, more);
    refused(other_m, "2 micro-batches a step");
    testing::flip_bit(path, 200);  // in the middle of the parameters
    trainer_t<pipeline::one_f_one_b> same(t, {stage_t(testing::test_widths(), 0, 8, testing::test_batch)},
                                          adam<double>(0.01), {}, o);
    refused(same, "is corrupt");
    std::filesystem::remove(path);
  });
  CHECK(wrong == std::vector<std::string>{});
}

TEST_CASE("pipeline: the executor's messages go into the flight recorder, completed and numbered per tag",
          "[pipeline][flight]") {
  // 1F1B on 2 ranks, 4 micro-batches, 3 steps: each way 12 messages on one tag (activations
  // forward, gradients back), and one handshake message from rank 0 to rank 1 on another; each
  // send on a tag meets a receive of the same number, type and count on the other rank.
  const std::uint64_t before = flight::recorder::global().recorded();  // this case's records come after
  run_inproc(2, [&](int, inproc_transport t) {
    const case_result r = testing::run_pipeline_case(std::move(t), pipeline::one_f_one_b{}, sgd<double>(0.1), 4, 3);
    if (r.wrong > 0) throw std::runtime_error(r.first);
  });
  // (rank, send, tag) -> each message's k, type and count, in the order posted
  std::map<std::tuple<int, bool, std::uint64_t>, std::vector<std::tuple<std::uint64_t, dtype, std::uint64_t>>> seen;
  int unfinished = 0;
  flight::recorder::global().for_each([&](const flight::call& c) {
    if (c.id <= before || c.sig.op != coll_op::message) return;
    seen[{c.rank, c.sending, c.tag}].push_back({c.sig.seq, c.sig.type, c.sig.count});
    unfinished += c.where == flight::state::completed ? 0 : 1;
    CHECK(c.peer == 1 - c.rank);
  });
  CHECK(unfinished == 0);
  std::map<std::pair<int, bool>, std::vector<std::size_t>> counts;  // (rank, send) -> messages per tag
  for (const auto& [key, messages] : seen) {
    const auto [rank, send, tag] = key;
    for (std::size_t i = 0; i < messages.size(); ++i) CHECK(std::get<0>(messages[i]) == i + 1);
    const auto other = seen.find({1 - rank, !send, tag});
    REQUIRE(other != seen.end());
    CHECK(other->second == messages);  // the same numbers, types and counts
    counts[{rank, send}].push_back(messages.size());
  }
  for (auto& [key, n] : counts) std::sort(n.begin(), n.end());
  using v = std::vector<std::size_t>;
  CHECK(counts[{0, true}] == v{1, 12});
  CHECK(counts[{0, false}] == v{12});
  CHECK(counts[{1, true}] == v{12});
  CHECK(counts[{1, false}] == v{1, 12});
}
