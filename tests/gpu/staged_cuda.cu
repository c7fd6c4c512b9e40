// The staged communicator on the GPU: device buffers, staged through pinned memory, reduced by
// Thrust on the device; several ranks (threads here) sharing one GPU, which NCCL refuses.

#include <mutex>
#include <string>
#include <vector>

#include "../catch.hpp"
#include "dtrain/collective/staged.hpp"
#include "dtrain/concepts/collective.hpp"
#include "dtrain/transport/inproc.hpp"
#include "gpu.hpp"

using namespace dtrain;

static_assert(std::is_same_v<staged_communicator<inproc_transport>::memory_space, device_memory>);
static_assert(collective<staged_communicator<inproc_transport>>);

TEST_CASE("staged communicator on the GPU: ranks sharing one device allreduce device buffers", "[gpu][staged]") {
  DTRAIN_REQUIRE_GPUS(1);
  constexpr int p = 3;
  constexpr std::size_t n = (std::size_t{1} << 20) + 5;
  std::vector<std::vector<float>> results(p);
  std::mutex m;
  std::vector<std::string> errors;
  run_inproc(p, [&](int r, inproc_transport t) {
    try {
      staged_communicator<inproc_transport> comm(std::move(t));
      std::vector<float> mine(n);
      for (std::size_t i = 0; i < n; ++i) mine[i] = static_cast<float>((r + 1) * 10 + static_cast<int>(i % 13));
      dtrain::cuda::device_buffer<float> d(n);
      dtrain::cuda::check(cudaMemcpy(d.data(), mine.data(), n * sizeof(float), cudaMemcpyHostToDevice), "H2D");
      comm.allreduce(d.span(), reduce_op::sum);
      std::vector<float> back(n);
      dtrain::cuda::check(cudaMemcpy(back.data(), d.data(), n * sizeof(float), cudaMemcpyDeviceToHost), "D2H");
      results[static_cast<std::size_t>(r)] = back;
    } catch (const std::exception& e) {
      std::lock_guard lock(m);
      errors.push_back(e.what());
    }
  });
  REQUIRE(errors.empty());
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) {
    float want = 0;
    for (int q = 0; q < p; ++q) want += static_cast<float>((q + 1) * 10 + static_cast<int>(i % 13));
    wrong += results[0][i] != want;
  }
  CHECK(wrong == 0);
  CHECK(results[1] == results[0]);
  CHECK(results[2] == results[0]);
}
