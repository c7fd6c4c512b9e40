// The device side of bench_device_reduce: dtrain's Thrust reduction (CUDA system, enqueued on a
// stream) and a device-to-device copy, each timed with CUDA events.

#include "device_reduce_kernels.hpp"

#include <thrust/execution_policy.h>

#include "dtrain/cuda/runtime.hpp"
#include "dtrain/reduce/thrust.hpp"

namespace dtrain::bench {

namespace {
// Mean milliseconds per call of `f` (which enqueues on `s`), after one warm-up call.
template <class F>
double time_ms(cudaStream_t s, int iterations, F&& f) {
  f();
  cudaEvent_t start = nullptr, stop = nullptr;
  cuda::check(cudaEventCreate(&start), "cudaEventCreate");
  cuda::check(cudaEventCreate(&stop), "cudaEventCreate");
  cuda::check(cudaEventRecord(start, s), "cudaEventRecord");
  for (int i = 0; i < iterations; ++i) f();
  cuda::check(cudaEventRecord(stop, s), "cudaEventRecord");
  cuda::check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  cuda::check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return static_cast<double>(ms) / iterations;
}
}  // namespace

double reduce_ms(float* dst, const float* src, std::size_t n, cudaStream_t s, int iterations) {
  const auto reduction = stream_reduction(s);
  return time_ms(s, iterations, [&] {
    reduction(device_span<float>(dst, n), device_span<const float>(src, n), reduce_op::sum);
  });
}

double copy_ms(float* dst, const float* src, std::size_t n, cudaStream_t s, int iterations) {
  return time_ms(s, iterations, [&] {
    cuda::check(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
  });
}

}  // namespace dtrain::bench
