#pragma once
/// @file
/// `thrust_reduction`: element-wise reductions through Thrust, so the same code runs on the CPU
/// (THRUST_DEVICE_SYSTEM CPP or OMP) and on the GPU (CUDA). Link `dtrain::thrust`.
///
/// Determinism: each element is combined exactly once per call (`thrust::transform`), so the
/// result is the same bits on every system and every run; no reassociation happens.

#include <cstddef>
#include <span>
#include <type_traits>

#include <thrust/execution_policy.h>
#include <thrust/transform.h>

#include "dtrain/concepts/element.hpp"
#include "dtrain/core/config.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/memory_space.hpp"
#include "dtrain/core/reduce_op.hpp"
#include "dtrain/cuda/thrust_space.hpp"

namespace dtrain {

namespace detail {

/// Half(x * scale): packs a value for a 16-bit reduction (as `detail::pack_scaled` on the host).
template <class Half, class T>
struct pack_half {
  float scale;
  DTRAIN_HOST_DEVICE Half operator()(T x) const { return Half(static_cast<float>(x) * scale); }
};

/// v * factor: scales a value (a loss-scaled gradient unscaled, a gradient sum made a mean).
template <class T>
struct times {
  T factor;
  DTRAIN_HOST_DEVICE T operator()(T v) const { return v * factor; }
};

/// T(h): widens a 16-bit value back (as `detail::unpack` on the host).
template <class Half, class T>
struct widen_half {
  DTRAIN_HOST_DEVICE T operator()(Half h) const { return static_cast<T>(static_cast<float>(h)); }
};

template <reduce_op Op, class T>
struct combine_fn {
  DTRAIN_HOST_DEVICE T operator()(T a, T b) const { return combine_elements<Op>(a, b); }
};

template <class T>
struct average_fn {
  int n;
  DTRAIN_HOST_DEVICE T operator()(T a) const { return average_of_sum(a, n); }
};

}  // namespace detail

/// Reduces buffers with Thrust under execution policy `Policy` (a model of `reduction`).
/// `Policy` defaults to `thrust::device`'s type, which synchronises after each call; pass
/// `thrust::cuda::par_nosync.on(stream)` (see `stream_reduction`) for stream-ordered execution
/// on the GPU: the call only enqueues, and work after it on `stream` sees the result.
/// Buffers are `thrust_buffer<T>`: `device_span` under CUDA, `std::span` otherwise.
template <class Policy = std::remove_cvref_t<decltype(thrust::device)>>
class thrust_reduction {
 public:
  using memory_space = thrust_device_memory;

  thrust_reduction() = default;
  explicit thrust_reduction(Policy policy) : policy_(policy) {}

  /// `dst[i] = op(dst[i], src[i])` (`avg` combines as sum). @pre equal sizes, no overlap.
  template <element T>
  void operator()(thrust_buffer<T> dst, thrust_buffer<const T> src, reduce_op op) const {
    DTRAIN_ASSERT(dst.size() == src.size(), "reduction of buffers of different sizes");
    switch (op) {
      case reduce_op::sum:
      case reduce_op::avg: run<reduce_op::sum>(dst, src); break;
      case reduce_op::prod: run<reduce_op::prod>(dst, src); break;
      case reduce_op::min: run<reduce_op::min>(dst, src); break;
      case reduce_op::max: run<reduce_op::max>(dst, src); break;
      case reduce_op::custom: DTRAIN_ASSERT(false, "a user's operator reduces through user_reduction"); break;
      case reduce_op::band:
      case reduce_op::bor:
      case reduce_op::bxor:
        if constexpr (bitwise_reducible_v<T>) {
          if (op == reduce_op::band) run<reduce_op::band>(dst, src);
          if (op == reduce_op::bor) run<reduce_op::bor>(dst, src);
          if (op == reduce_op::bxor) run<reduce_op::bxor>(dst, src);
        } else {
          DTRAIN_ASSERT(false, "bitwise operators on a type refused_reduction refuses");
        }
        break;
    }
  }

  /// Divides every element of `buf` by `n`.
  template <element T>
  void finish_average(thrust_buffer<T> buf, int n) const {
    thrust::transform(policy_, buf.data(), buf.data() + buf.size(), buf.data(),
                      detail::average_fn<T>{n});
  }

 private:
  template <reduce_op Op, class T>
  void run(thrust_buffer<T> dst, thrust_buffer<const T> src) const {
    thrust::transform(policy_, dst.data(), dst.data() + dst.size(), src.data(), dst.data(),
                      detail::combine_fn<Op, T>{});
  }

  Policy policy_{};
};

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
/// A Thrust reduction enqueued on a CUDA stream without synchronising (stream-ordered).
inline auto stream_reduction(cudaStream_t stream) {
  auto policy = thrust::cuda::par_nosync.on(stream);
  return thrust_reduction<decltype(policy)>(policy);
}
#endif

namespace detail {
/// The Thrust reduction that enqueues on `s` (under CPP, OMP and TBB: runs on the calling thread).
#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
inline auto reduction_on(thrust_space::stream_handle s) { return stream_reduction(s); }
#else
inline auto reduction_on(thrust_space::stream_handle) { return thrust_reduction<>{}; }
#endif
}  // namespace detail

}  // namespace dtrain
