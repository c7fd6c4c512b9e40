// The staged communicator on the GPU: device buffers, staged through pinned memory, reduced by
// Thrust on the device; several ranks (threads here) sharing one GPU, which NCCL refuses.

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include <thrust/execution_policy.h>
#include <thrust/tabulate.h>

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

namespace {
// Rank r's message: r * 1000 + i % 997 (exact in float).
struct ring_value {
  int rank;
  __host__ __device__ float operator()(std::size_t i) const {
    return static_cast<float>(rank * 1000 + static_cast<int>(i % 997));
  }
};
}  // namespace

TEST_CASE("staged communicator on the GPU: device buffers sent point to point, receives posted first",
          "[gpu][staged][p2p]") {
  DTRAIN_REQUIRE_GPUS(1);
  constexpr int p = 3;
  constexpr std::size_t n = (std::size_t{1} << 18) + 3;
  std::vector<std::vector<float>> received(p);
  std::vector<std::string> errors(p);
  run_inproc(p, [&](int r, inproc_transport t) {
    try {
      staged_communicator<inproc_transport> comm(std::move(t));
      const int next = (r + 1) % p, prev = (r + p - 1) % p;
      dtrain::cuda::device_buffer<float> in(n), out(n);
      auto rx = comm.irecv(prev, 1, in.span());
      // Written by a kernel on the legacy default stream, not waited for: the send's staging copy
      // must be ordered after it.
      thrust::tabulate(thrust::cuda::par_nosync.on(cudaStream_t{}), out.data(), out.data() + n, ring_value{r});
      auto tx = comm.isend(next, 1, out.span());
      rx.wait(deadline::after(std::chrono::seconds(30)));
      tx.wait(deadline::after(std::chrono::seconds(30)));
      std::vector<float> back(n);
      dtrain::cuda::check(cudaMemcpy(back.data(), in.data(), n * sizeof(float), cudaMemcpyDeviceToHost), "D2H");
      received[static_cast<std::size_t>(r)] = back;
      dtrain::cuda::device_buffer<double> wrong_type(n);
      if (r == 0) comm.send(1, 2, out.span());
      if (r == 1) {
        try {
          comm.recv(0, 2, wrong_type.span());
        } catch (const dtrain::error& e) {
          errors[1] = e.what();
        }
      }
    } catch (const std::exception& e) {
      errors[static_cast<std::size_t>(r)] = std::string("unexpected: ") + e.what();
    }
  });
  for (int r = 0; r < p; ++r) {
    const int prev = (r + p - 1) % p;
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) {
      wrong += received[static_cast<std::size_t>(r)][i] != static_cast<float>(prev * 1000 + static_cast<int>(i % 997));
    }
    CHECK(wrong == 0);
  }
  CHECK(errors[0].empty());
  CHECK(errors[1].find("expected 262147 float64, the sender sent 262147 float32") != std::string::npos);
  CHECK(errors[2].empty());
}
