#pragma once
/// @file
/// The tensor-parallel layers (linear.hpp) on Thrust's device memory: `thrust_tensors` keeps the
/// layers' tensors there, and `thrust_kernels` computes their products with Thrust, one thread per
/// output element summing in the order `loop_kernels` does, so the two give the same bits under
/// Thrust's CPP system (tested without a GPU) and the layers run on the GPU in a CUDA build.
/// cublas_kernels.hpp has cuBLAS's products over the same memory.
///
/// Everything is enqueued on the legacy default stream, which the staged communicator and
/// `nccl_communicator` order their work after: a layer's collectives see its products. A model
/// whose kernels run on streams of its own makes them complete (or ordered with events) before it
/// calls a layer, and waits for the default stream before it reads what a layer wrote.
/// Link `dtrain::thrust` (and `dtrain::cuda` in a CUDA build, compiled by nvcc).

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include "dtrain/core/config.hpp"
#include "dtrain/cuda/thrust_space.hpp"

namespace dtrain::tensor_parallel {

namespace detail {
namespace thrust_space = dtrain::detail::thrust_space;

// One thread per output element (nvcc wants the functors at namespace scope).
template <class T>
struct multiply_transposed_op {  // y[s, o] += x[s, :] . w[o, :]
  const T* x;
  const T* w;
  T* y;
  std::size_t in, out;
  DTRAIN_HOST_DEVICE void operator()(std::size_t k) const {
    const std::size_t s = k / out, o = k % out;
    T z = y[k];
    for (std::size_t i = 0; i < in; ++i) z += x[s * in + i] * w[o * in + i];
    y[k] = z;
  }
};
template <class T>
struct weight_gradient_op {  // gw[o, i] += sum over s of dy[s, o] x[s, i], in s's order
  const T* x;
  const T* dy;
  T* gw;
  std::size_t in, out, batch;
  DTRAIN_HOST_DEVICE void operator()(std::size_t k) const {
    const std::size_t o = k / in, i = k % in;
    T g = gw[k];
    for (std::size_t s = 0; s < batch; ++s) g += dy[s * out + o] * x[s * in + i];
    gw[k] = g;
  }
};
template <class T>
struct input_gradient_op {  // dx[s, i] = sum over o of dy[s, o] w[o, i], in o's order
  const T* dy;
  const T* w;
  T* dx;
  std::size_t in, out;
  DTRAIN_HOST_DEVICE void operator()(std::size_t k) const {
    const std::size_t s = k / in, i = k % in;
    T z = T(0);
    for (std::size_t o = 0; o < out; ++o) z += dy[s * out + o] * w[o * in + i];
    dx[k] = z;
  }
};
template <class T>
struct rows_op {  // y[s, o] = b[o], or += b[o]
  const T* b;
  T* y;
  std::size_t n;
  bool add;
  DTRAIN_HOST_DEVICE void operator()(std::size_t k) const {
    if (add) {
      y[k] += b[k % n];
    } else {
      y[k] = b[k % n];
    }
  }
};
template <class T>
struct sum_rows_op {  // g[o] += sum over s of dy[s, o], in s's order
  const T* dy;
  T* g;
  std::size_t n, rows;
  DTRAIN_HOST_DEVICE void operator()(std::size_t o) const {
    T v = g[o];
    for (std::size_t s = 0; s < rows; ++s) v += dy[s * n + o];
    g[o] = v;
  }
};

template <class F>
void for_each_index(std::size_t n, F f) {
  if (n == 0) return;
  thrust::for_each(thrust_space::on(thrust_space::stream_handle{}), thrust::counting_iterator<std::size_t>(0),
                   thrust::counting_iterator<std::size_t>(n), f);
}

}  // namespace detail

/// The layers' tensors in Thrust's device memory, their work on the legacy default stream.
struct thrust_tensors {
  using memory_space = thrust_device_memory;
  template <class T>
  using span = thrust_buffer<T>;
  template <class T>
  using buffer = dtrain::detail::thrust_space::buffer<T>;

  template <class T>
  static buffer<T> allocate(std::size_t n) {
    buffer<T> b(n);
    zero<T>(b.span());
    return b;
  }
  template <class T>
  static span<T> whole(buffer<T>& b) noexcept {
    return b.span();
  }
  /// Room for `n` values (contents not kept: the layers' work buffers).
  template <class T>
  static void resize(buffer<T>& b, std::size_t n) {
    if (b.size() != n) b = buffer<T>(n);
  }

  template <class T>
  static void rows(span<const T> b, span<T> y, std::size_t rows, bool add) {
    detail::for_each_index(rows * b.size(), detail::rows_op<T>{b.data(), y.data(), b.size(), add});
  }
  template <class T>
  static void sum_rows(span<const T> dy, span<T> g, std::size_t rows) {
    detail::for_each_index(g.size(), detail::sum_rows_op<T>{dy.data(), g.data(), g.size(), rows});
  }
  template <class T>
  static void zero(span<T> s) {
    dtrain::detail::thrust_space::zero<T>(s, {});
  }
  template <class T>
  static void upload(span<T> to, std::span<const T> from) {
    dtrain::detail::thrust_space::upload<T>(to, from, {});
  }
  template <class Collective>
  static std::vector<std::int64_t> allgather_values(Collective& c, std::span<const std::int64_t> mine) {
    return dtrain::detail::thrust_space::allgather_through_device(c, mine, {});
  }
};

/// `loop_kernels`' products with Thrust on device memory: the same sums in the same order.
struct thrust_kernels {
  using memory = thrust_tensors;

  /// y (batch x out) += x (batch x in) W^T, W row-major out x in.
  template <class T>
  static void multiply_transposed(thrust_buffer<const T> x, thrust_buffer<const T> w, std::size_t in,
                                  std::size_t out, thrust_buffer<T> y) {
    const std::size_t batch = in == 0 ? 0 : x.size() / in;
    detail::for_each_index(batch * out, detail::multiply_transposed_op<T>{x.data(), w.data(), y.data(), in, out});
  }

  /// gw (out x in) += dy^T x; dx (batch x in) = dy W (dx may be empty: not wanted).
  template <class T>
  static void linear_backward(thrust_buffer<const T> x, thrust_buffer<const T> dy, thrust_buffer<const T> w,
                              std::size_t in, std::size_t out, thrust_buffer<T> gw, thrust_buffer<T> dx) {
    const std::size_t batch = out == 0 ? 0 : dy.size() / out;
    detail::for_each_index(out * in, detail::weight_gradient_op<T>{x.data(), dy.data(), gw.data(), in, out, batch});
    if (dx.empty()) return;
    if (out == 0) {  // a rank without output features contributes nothing to the input gradient
      thrust_tensors::zero<T>(dx);
    } else {
      detail::for_each_index(batch * in, detail::input_gradient_op<T>{dy.data(), w.data(), dx.data(), in, out});
    }
  }
};

}  // namespace dtrain::tensor_parallel
