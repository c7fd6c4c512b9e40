#pragma once
/// @file
/// The arithmetic and the memory of the tensor-parallel layers (linear.hpp), on host memory:
/// `loop_kernels`, the two products as plain loops (the reference), and `host_tensors`, where the
/// layers keep their tensors and how they fill, sum and copy them. device_kernels.hpp has the
/// same on Thrust's device memory.
///
/// A `Kernels` policy gives the layers `multiply_transposed` and `linear_backward` (below) as
/// static functions; it names its memory with `using memory = ...` (`host_tensors` when it does
/// not: a user's host policy needs only the two products, as an Eigen or BLAS product does).
/// A memory policy answers:
///  - `span<T>`, `buffer<T>`, `allocate<T>(n)` (zeros), `whole(b)`, `resize(b, n)`;
///  - `rows(b, y, rows, add)`: y's rows set to (or, with `add`, increased by) the vector b;
///  - `sum_rows(dy, g, rows)`: g += the sum of dy's rows; `zero(s)`;
///  - `upload(to, from)`: host values into its memory (a layer's `load`);
///  - `allgather_values(c, mine)`: every rank's host values, gathered over a collective of it.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "dtrain/core/memory_space.hpp"
#include "dtrain/detail/allgather_on_host.hpp"

namespace dtrain::tensor_parallel {

/// The products a tensor-parallel layer needs, as plain loops. Weights come as spans so that a
/// policy can map them (Eigen::Map, a BLAS call) without a copy.
struct loop_kernels {
  /// y (batch x out) += x (batch x in) W^T, W row-major out x in.
  template <class T>
  static void multiply_transposed(std::span<const T> x, std::span<const T> w, std::size_t in, std::size_t out,
                                  std::span<T> y) {
    const std::size_t batch = in == 0 ? 0 : x.size() / in;
    for (std::size_t s = 0; s < batch; ++s) {
      for (std::size_t o = 0; o < out; ++o) {
        T z = y[s * out + o];
        for (std::size_t i = 0; i < in; ++i) z += x[s * in + i] * w[o * in + i];
        y[s * out + o] = z;
      }
    }
  }

  /// gw (out x in) += dy^T x; dx (batch x in) = dy W (dx may be empty: not wanted).
  template <class T>
  static void linear_backward(std::span<const T> x, std::span<const T> dy, std::span<const T> w, std::size_t in,
                              std::size_t out, std::span<T> gw, std::span<T> dx) {
    const std::size_t batch = out == 0 ? 0 : dy.size() / out;
    for (T& v : dx) v = T(0);
    for (std::size_t s = 0; s < batch; ++s) {
      for (std::size_t o = 0; o < out; ++o) {
        const T d = dy[s * out + o];
        for (std::size_t i = 0; i < in; ++i) {
          gw[o * in + i] += d * x[s * in + i];
          if (!dx.empty()) dx[s * in + i] += d * w[o * in + i];
        }
      }
    }
  }
};

/// The layers' tensors in host memory (`std::vector`s).
struct host_tensors {
  using memory_space = host_memory;
  template <class T>
  using span = std::span<T>;
  template <class T>
  using buffer = std::vector<T>;

  template <class T>
  static buffer<T> allocate(std::size_t n) {
    return buffer<T>(n, T(0));
  }
  template <class T>
  static span<T> whole(buffer<T>& b) noexcept {
    return b;
  }
  template <class T>
  static void resize(buffer<T>& b, std::size_t n) {
    b.resize(n);
  }

  template <class T>
  static void rows(std::span<const T> b, std::span<T> y, std::size_t rows, bool add) {
    for (std::size_t s = 0; s < rows; ++s) {
      for (std::size_t o = 0; o < b.size(); ++o) {
        if (add) {
          y[s * b.size() + o] += b[o];
        } else {
          y[s * b.size() + o] = b[o];
        }
      }
    }
  }
  template <class T>
  static void sum_rows(std::span<const T> dy, std::span<T> g, std::size_t rows) {
    for (std::size_t s = 0; s < rows; ++s) {
      for (std::size_t o = 0; o < g.size(); ++o) g[o] += dy[s * g.size() + o];
    }
  }
  template <class T>
  static void zero(std::span<T> s) {
    for (T& v : s) v = T(0);
  }
  template <class T>
  static void upload(std::span<T> to, std::span<const T> from) {
    for (std::size_t k = 0; k < from.size(); ++k) to[k] = from[k];
  }
  template <class Collective>
  static std::vector<std::int64_t> allgather_values(Collective& c, std::span<const std::int64_t> mine) {
    return dtrain::detail::allgather_on_host(c, mine);
  }
};

namespace detail {
template <class Kernels>
struct memory_policy {
  using type = host_tensors;
};
template <class Kernels>
  requires requires { typename Kernels::memory; }
struct memory_policy<Kernels> {
  using type = typename Kernels::memory;
};
}  // namespace detail

/// Where a `Kernels` policy's layers keep their tensors: `Kernels::memory`, or host memory.
template <class Kernels>
using memory_of = typename detail::memory_policy<Kernels>::type;

}  // namespace dtrain::tensor_parallel
