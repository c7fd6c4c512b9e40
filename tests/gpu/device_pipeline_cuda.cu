// The pipeline executor on the GPU: stages whose parameters, gradients and activations are device
// buffers (device_mlp_stage.cuh), ranks as threads sharing one GPU, activations sent through the
// staged communicator's point-to-point messages. Every schedule leaves the parameters bit for bit
// where serial gradient accumulation does (PipeDream's weight stashing by device copies too).

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "../catch.hpp"
#include "../pipeline/device_case.hpp"
#include "device_mlp_stage.cuh"
#include "dtrain/collective/staged.hpp"
#include "dtrain/topology/mesh.hpp"
#include "dtrain/transport/group.hpp"
#include "dtrain/transport/inproc.hpp"
#include "dtrain/updater/adam.hpp"
#include "dtrain/updater/sgd.hpp"
#include "gpu.hpp"

using namespace dtrain;

namespace {

using staged = staged_communicator<inproc_transport>;

template <class Schedule, class Updater>
void check_exact_on_gpu(const Schedule& schedule, const Updater& updater) {
  for (int p = 1; p <= 3; ++p) {
    for (int m : {1, 4}) {
      std::atomic<int> wrong{0};
      std::string first;
      std::mutex mu;
      run_inproc(p, [&](int, inproc_transport t) {
        std::string mine;
        try {
          staged comm(std::move(t));
          auto make = [](std::vector<int> w, int from, int to, int batch) {
            return testing::device_mlp_stage(std::move(w), from, to, batch);
          };  // one replica
          wrong += testing::device_case_wrong<testing::device_mlp_stage>(comm, schedule, updater, m, 2, make, mine);
        } catch (const std::exception& e) {
          ++wrong;
          mine = std::string("unexpected: ") + e.what();
        }
        std::lock_guard lock(mu);
        if (first.empty()) first = mine;
      });
      INFO(Schedule::name << " p " << p << " m " << m << ": " << first);
      CHECK(wrong.load() == 0);
    }
  }
}

}  // namespace

TEST_CASE("device pipeline on the GPU: every schedule with device stages equals the serial reference bit for bit",
          "[gpu][pipeline]") {
  DTRAIN_REQUIRE_GPUS(1);
  check_exact_on_gpu(pipeline::gpipe{true}, sgd<double>(0.1));
  check_exact_on_gpu(pipeline::one_f_one_b{}, adam<double>(0.01));
  check_exact_on_gpu(pipeline::interleaved_one_f_one_b{2}, sgd<double>(0.1));
  check_exact_on_gpu(pipeline::pipedream{}, adam<double>(0.01));
}

namespace {

using group = process_group<inproc_transport>;
using staged_group = staged_communicator<group>;

testing::device_mlp_stage make_stage(std::vector<int> widths, int from, int to, int batch, int replica, int replicas) {
  return testing::device_mlp_stage(std::move(widths), from, to, batch, replica, replicas);
}

}  // namespace

TEST_CASE("device pipeline on the GPU: the trainer with device stages and replicas on a mesh equals serial training",
          "[gpu][pipeline]") {
  DTRAIN_REQUIRE_GPUS(1);
  for (int dp : {1, 2}) {
    for (int pp : {1, 2}) {
      std::atomic<int> wrong{0};
      std::string first;
      std::mutex mu;
      std::vector<std::vector<std::byte>> bits(static_cast<std::size_t>(dp * pp));
      run_inproc(dp * pp, [&](int, inproc_transport t) {
        testing::device_trainer_result r;
        int slot = 0;
        try {
          device_mesh<inproc_transport> mesh(group(std::move(t)), {{"dp", dp}, {"pp", pp}});
          const int replica = mesh.coordinate("dp");
          slot = replica * pp + mesh.coordinate("pp");
          r = dp == 1 ? testing::device_trainer_case<testing::device_mlp_stage>(
                            staged_group(mesh.group("pp")), pipeline::single_replica{}, 0, pipeline::one_f_one_b{},
                            adam<double>(0.01), 4, 3, make_stage)
                      : testing::device_trainer_case<testing::device_mlp_stage>(
                            staged_group(mesh.group("pp")), staged_group(mesh.group("dp")), replica,
                            pipeline::one_f_one_b{}, adam<double>(0.01), 4, 3, make_stage);
        } catch (const std::exception& e) {
          r.wrong = 1;
          r.first = std::string("unexpected: ") + e.what();
        }
        wrong += r.wrong;
        std::lock_guard lock(mu);
        bits[static_cast<std::size_t>(slot)] = std::move(r.bits);
        if (r.wrong > 0 && first.empty()) first = r.first;
      });
      INFO("dp " << dp << " pp " << pp << ": " << first);
      CHECK(wrong.load() == 0);
      for (const auto& b : bits) REQUIRE(!b.empty());
      for (std::size_t i = static_cast<std::size_t>(pp); i < bits.size(); ++i) CHECK(bits[i] == bits[i % pp]);
    }
  }
}

TEST_CASE("device pipeline on the GPU: a trainer resumed from its checkpoint continues bit for bit",
          "[gpu][pipeline][checkpoint]") {
  DTRAIN_REQUIRE_GPUS(1);
  std::atomic<int> wrong{0};
  std::string first;
  std::mutex mu;
  run_inproc(2, [&](int r, inproc_transport t) {
    testing::device_trainer_result result;
    const std::string path = "/tmp/dtrain_device_pipeline_gpu." + std::to_string(r) + ".ckpt";
    try {
      result = testing::device_trainer_case<testing::device_mlp_stage>(
          staged(std::move(t)), pipeline::single_replica{}, 0, pipeline::pipedream{}, adam<double>(0.01), 3, 4,
          make_stage, 2, path);
    } catch (const std::exception& e) {
      result.wrong = 1;
      result.first = std::string("unexpected: ") + e.what();
    }
    std::remove(path.c_str());
    wrong += result.wrong;
    std::lock_guard lock(mu);
    if (result.wrong > 0 && first.empty()) first = result.first;
  });
  INFO(first);
  CHECK(wrong.load() == 0);
}
