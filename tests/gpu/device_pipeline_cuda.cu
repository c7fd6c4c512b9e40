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
          };
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
