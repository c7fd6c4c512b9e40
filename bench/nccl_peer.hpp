#pragma once
// The peer of bench_device_collectives' NCCL rows: ncclAllReduce called directly on a
// communicator of its own, timed the way nccl-tests times it (every iteration enqueued back to
// back, one stream synchronisation at the end) and one call at a time (each synchronised), the
// two ways dtrain's rows run. No dtrain code runs in the timed loop.

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "dtrain/core/error.hpp"
#include "dtrain/cuda/runtime.hpp"

namespace dtrain::bench {

class raw_nccl {
 public:
  /// Collective on `host`, which connects the same ranks: rank 0's id is broadcast through it.
  template <class HostCollective>
  explicit raw_nccl(HostCollective& host) : size_(host.size()) {
    ncclUniqueId id{};
    if (host.rank() == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    std::array<std::int64_t, sizeof(ncclUniqueId) / sizeof(std::int64_t)> words{};
    std::memcpy(words.data(), &id, sizeof id);
    host.broadcast(std::span<std::int64_t>(words), 0);
    std::memcpy(&id, words.data(), sizeof id);
    check(ncclCommInitRank(&comm_, host.size(), id, host.rank()), "ncclCommInitRank");
  }
  raw_nccl(const raw_nccl&) = delete;
  raw_nccl& operator=(const raw_nccl&) = delete;
  ~raw_nccl() {
    cudaStreamSynchronize(stream_.get());
    ncclCommDestroy(comm_);
  }

  int size() const noexcept { return size_; }

  /// Seconds per ncclAllReduce (sum of floats) of `count` elements, out of place: every call
  /// enqueued back to back, or (`blocking`) each waited for before the next.
  double allreduce_seconds(const float* in, float* out, std::size_t count, int warmup, int iterations, bool blocking) {
    auto call = [&] {
      check(ncclAllReduce(in, out, count, ncclFloat, ncclSum, comm_, stream_.get()), "ncclAllReduce");
      if (blocking) cuda::check(cudaStreamSynchronize(stream_.get()), "cudaStreamSynchronize");
    };
    for (int k = 0; k < warmup; ++k) call();
    cuda::check(cudaStreamSynchronize(stream_.get()), "cudaStreamSynchronize");
    const auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < iterations; ++k) call();
    cuda::check(cudaStreamSynchronize(stream_.get()), "cudaStreamSynchronize");
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iterations;
  }

 private:
  static void check(ncclResult_t r, const char* what) {
    if (r != ncclSuccess)
      throw error(errc::device_error, std::string("raw nccl: ") + what + ": " + ncclGetErrorString(r));
  }

  ncclComm_t comm_ = nullptr;
  int size_ = 1;
  cuda::stream stream_;
};

}  // namespace dtrain::bench
