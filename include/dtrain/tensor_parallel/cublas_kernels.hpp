#pragma once
/// @file
/// cuBLAS's products for the tensor-parallel layers on GPU memory (a CUDA build): `cublas_kernels`
/// keeps the layers' tensors where `thrust_kernels` does (device_kernels.hpp) and computes
/// `multiply_transposed` and `linear_backward` with one `cublasGemmEx` each, on the legacy default
/// stream, for `float` and `double` (the layers' element types).
/// cuBLAS sums in its own order: the results equal `thrust_kernels`' within rounding, not bit for
/// bit. Link `dtrain::cublas` (and `dtrain::thrust`), compiled by nvcc.
///
/// The layers' matrices are row-major; cuBLAS's are column-major, where a row-major m x n matrix
/// is its n x m transpose. So y = x W^T + y is, to cuBLAS, y^T = W^T' x^T + y^T with W^T' the
/// column-major view of W transposed back; the three calls below are written in those views.

#include <cstddef>
#include <string>

#include <cublas_v2.h>
#include <thrust/version.h>

#include "dtrain/core/error.hpp"
#include "dtrain/cuda/runtime.hpp"
#include "dtrain/tensor_parallel/device_kernels.hpp"

#if THRUST_DEVICE_SYSTEM != THRUST_DEVICE_SYSTEM_CUDA
#error "dtrain/tensor_parallel/cublas_kernels.hpp needs Thrust's CUDA device system (a CUDA build)"
#endif

namespace dtrain::tensor_parallel {

namespace detail {

inline void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    throw error(errc::device_error, std::string(what) + ": " + cublasGetStatusName(s) + " (" +
                                        cublasGetStatusString(s) + ")");
  }
}

// This thread's handle on the device current when it was made, on the legacy default stream.
class cublas_handle {
 public:
  cublas_handle() {
    check_cublas(cublasCreate(&h_), "cublasCreate");
    check_cublas(cublasSetStream(h_, nullptr), "cublasSetStream");
  }
  cublas_handle(const cublas_handle&) = delete;
  cublas_handle& operator=(const cublas_handle&) = delete;
  ~cublas_handle() { cublasDestroy(h_); }
  static cublasHandle_t get() {
    thread_local cublas_handle mine;
    return mine.h_;
  }

 private:
  cublasHandle_t h_ = nullptr;
};

// cuBLAS's names for T and for the precision it accumulates T in.
template <class T>
struct cublas_type;
template <>
struct cublas_type<float> {
  static constexpr cudaDataType_t data = CUDA_R_32F;
  static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  using scale = float;
};
template <>
struct cublas_type<double> {
  static constexpr cudaDataType_t data = CUDA_R_64F;
  static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_64F;
  using scale = double;
};
// C (m x n) = alpha op(A) op(B) + beta C, column-major, as cublasGemmEx takes them.
template <class T>
void gemm(cublasOperation_t ta, cublasOperation_t tb, std::size_t m, std::size_t n, std::size_t k, const T* a,
          std::size_t lda, const T* b, std::size_t ldb, double beta, T* c, std::size_t ldc) {
  using type = cublas_type<T>;
  const typename type::scale one = 1, scale_c = static_cast<typename type::scale>(beta);
  check_cublas(cublasGemmEx(cublas_handle::get(), ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                            &one, a, type::data, static_cast<int>(lda), b, type::data, static_cast<int>(ldb), &scale_c,
                            c, type::data, static_cast<int>(ldc), type::compute, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
}

}  // namespace detail

/// The layers' products with cuBLAS, on Thrust's device memory (`thrust_tensors`).
struct cublas_kernels {
  using memory = thrust_tensors;

  /// y (batch x out) += x (batch x in) W^T, W row-major out x in. Column-major: y^T (out x batch)
  /// += W (the view of W: in x out, transposed) x^T (in x batch).
  template <class T>
  static void multiply_transposed(thrust_buffer<const T> x, thrust_buffer<const T> w, std::size_t in,
                                  std::size_t out, thrust_buffer<T> y) {
    const std::size_t batch = in == 0 ? 0 : x.size() / in;
    if (batch == 0 || out == 0) return;
    detail::gemm<T>(CUBLAS_OP_T, CUBLAS_OP_N, out, batch, in, w.data(), in, x.data(), in, 1.0, y.data(), out);
  }

  /// gw (out x in) += dy^T x; dx (batch x in) = dy W (dx may be empty: not wanted).
  /// Column-major: gw^T (in x out) += x^T (in x batch) dy (batch x out, the view of dy^T
  /// transposed); dx^T (in x batch) = W^T (in x out) dy^T (out x batch).
  template <class T>
  static void linear_backward(thrust_buffer<const T> x, thrust_buffer<const T> dy, thrust_buffer<const T> w,
                              std::size_t in, std::size_t out, thrust_buffer<T> gw, thrust_buffer<T> dx) {
    const std::size_t batch = out == 0 ? 0 : dy.size() / out;
    if (in == 0) return;
    if (batch > 0 && out > 0) {
      detail::gemm<T>(CUBLAS_OP_N, CUBLAS_OP_T, in, out, batch, x.data(), in, dy.data(), out, 1.0, gw.data(), in);
    }
    if (dx.empty()) return;
    if (out == 0) {
      thrust_tensors::zero<T>(dx);
    } else {
      detail::gemm<T>(CUBLAS_OP_N, CUBLAS_OP_N, in, batch, out, w.data(), in, dy.data(), out, 0.0, dx.data(), in);
    }
  }
};

}  // namespace dtrain::tensor_parallel
