// The pipeline executor over NCCL's point-to-point messages: stages whose parameters, gradients
// and activations are device buffers (device_mlp_stage.cuh), one rank per GPU (NCCL's rule; one
// rank on one GPU, where only the interleaved schedule's chunks message each other, through the
// lanes' copies to one's own rank). Every schedule leaves the parameters bit for bit where serial
// gradient accumulation does, as over the staged communicator.

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../catch.hpp"
#include "../pipeline/device_case.hpp"
#include "device_mlp_stage.cuh"
#include "dtrain/collective/nccl.hpp"
#include "dtrain/pipeline/device_link.hpp"
#include "dtrain/rendezvous/file_store.hpp"
#include "dtrain/updater/adam.hpp"
#include "dtrain/updater/sgd.hpp"
#include "gpu.hpp"

using namespace dtrain;

static_assert(point_to_point<nccl_communicator, double>);

namespace {

// Each schedule on as many ranks as there are GPUs (at most 3), 4 micro-batches, 2 steps.
template <class Schedule, class Updater>
void check_exact_over_nccl(const Schedule& schedule, const Updater& updater) {
  const int p = std::min(dtrain::cuda::device_count(), 3);
  const auto dir = std::filesystem::temp_directory_path() /
                   ("dtrain_nccl_pipeline_" + std::string(Schedule::name) + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::atomic<int> wrong{0};
  std::string first;
  std::mutex mu;
  std::vector<std::thread> ranks;
  for (int r = 0; r < p; ++r) {
    ranks.emplace_back([&, r] {
      std::string mine;
      try {
        file_store store(dir.string());
        nccl_options o;
        o.device = r;
        o.point_to_point = true;
        auto comm = nccl_communicator::connect(store, r, p, o);
        auto make = [](std::vector<int> w, int from, int to, int batch) {
          return testing::device_mlp_stage(std::move(w), from, to, batch);
        };
        wrong += testing::device_case_wrong<testing::device_mlp_stage>(comm, schedule, updater, 4, 2, make, mine);
      } catch (const std::exception& e) {
        ++wrong;
        mine = std::string("unexpected: ") + e.what();
      }
      std::lock_guard lock(mu);
      if (first.empty()) first = mine;
    });
  }
  for (auto& t : ranks) t.join();
  INFO(Schedule::name << " p " << p << ": " << first);
  CHECK(wrong.load() == 0);
}

}  // namespace

TEST_CASE("nccl pipeline: every schedule over NCCL point-to-point equals the serial reference bit for bit",
          "[gpu][pipeline][nccl]") {
  DTRAIN_REQUIRE_GPUS(1);
  check_exact_over_nccl(pipeline::gpipe{true}, sgd<double>(0.1));
  check_exact_over_nccl(pipeline::one_f_one_b{}, adam<double>(0.01));
  check_exact_over_nccl(pipeline::interleaved_one_f_one_b{2}, sgd<double>(0.1));
  check_exact_over_nccl(pipeline::pipedream{}, adam<double>(0.01));
}
