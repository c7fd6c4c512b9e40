#pragma once
// Timed device work for bench_device_reduce, compiled by nvcc (device_reduce_kernels.cu).

#include <cuda_runtime_api.h>

#include <cstddef>

namespace dtrain::bench {

/// Milliseconds per `dst[i] += src[i]` over `n` floats (dtrain's Thrust reduction on `s`).
double reduce_ms(float* dst, const float* src, std::size_t n, cudaStream_t s, int iterations);
/// Milliseconds per device-to-device copy of `n` floats on `s`.
double copy_ms(float* dst, const float* src, std::size_t n, cudaStream_t s, int iterations);

}  // namespace dtrain::bench
