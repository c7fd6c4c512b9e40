// The pipeline executor on the GPU: stages whose parameters, gradients and activations are device
// buffers (device_mlp_stage.cuh), ranks as threads sharing one GPU, activations sent through the
// staged communicator's point-to-point messages. Every schedule leaves the parameters bit for bit
// where serial gradient accumulation does (PipeDream's weight stashing by device copies too).

#include <atomic>
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
      run_inproc(dp * pp, [&](int, inproc_transport t) {
        testing::device_trainer_result r;
        try {
          device_mesh<inproc_transport> mesh(group(std::move(t)), {{"dp", dp}, {"pp", pp}});
          const int replica = mesh.coordinate("dp");
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
        if (r.wrong > 0 && first.empty()) first = r.first;
      });
      INFO("dp " << dp << " pp " << pp << ": " << first);
      CHECK(wrong.load() == 0);
    }
  }
}
