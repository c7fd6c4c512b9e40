#pragma once
// The stage-3 test model of tests/sharded/unit_model.hpp on the GPU: least squares run unit by
// unit, reading each unit's gathered parameters (device spans) through the trainer and writing
// its gradients into the trainer's device buffers, kernels on its own stream; it holds no weights.
// The forward pass adds each tensor's part of x . w to the residuals in feature order, as the host
// model does; the backward pass writes each unit's gradient, last unit first.

#include <cstddef>
#include <utility>
#include <vector>

#include "../allreduce/linear_model.hpp"
#include "dtrain/concepts/device_unit_model.hpp"
#include "dtrain/cuda/runtime.hpp"
#include "dtrain/sharded/thrust_backend.hpp"

namespace dtrain::testing {

// err[s] = -y[begin + s].
__global__ void unit_residuals_start(const double* y, std::size_t begin, std::size_t count, double* err) {
  const std::size_t s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s < count) err[s] = -y[begin + s];
}

// err[s] += x[begin + s][first .. first + size) . w.
__global__ void unit_residuals_add(const double* x, const double* w, std::size_t dim, std::size_t begin,
                                   std::size_t count, std::size_t first, std::size_t size, double* err) {
  const std::size_t s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= count) return;
  const double* xs = x + (begin + s) * dim + first;
  double e = err[s];
  for (std::size_t j = 0; j < size; ++j) e += xs[j] * w[j];
  err[s] = e;
}

// g[j] = sum_s err[s] x[begin + s][first + j] / count, in sample order.
__global__ void unit_gradient(const double* x, const double* err, std::size_t dim, std::size_t begin,
                              std::size_t count, std::size_t first, std::size_t size, double* g) {
  const std::size_t j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= size) return;
  double sum = 0;
  for (std::size_t s = 0; s < count; ++s) sum += err[s] * x[(begin + s) * dim + first + j] / static_cast<double>(count);
  g[j] = sum;
}

class device_unit_model {
 public:
  using value_type = double;
  using batch_type = std::pair<std::size_t, std::size_t>;

  device_unit_model(std::vector<std::vector<std::size_t>> units, const regression_data& data, double init)
      : units_(std::move(units)), dim_(data.dim), init_(init) {
    x_ = cuda::device_buffer<double>(data.x.size());
    y_ = cuda::device_buffer<double>(data.y.size());
    err_ = cuda::device_buffer<double>(data.y.size());
    cuda::check(cudaMemcpy(x_.data(), data.x.data(), data.x.size() * sizeof(double), cudaMemcpyHostToDevice), "H2D");
    cuda::check(cudaMemcpy(y_.data(), data.y.data(), data.y.size() * sizeof(double), cudaMemcpyHostToDevice), "H2D");
  }

  std::size_t unit_count() const noexcept { return units_.size(); }
  std::vector<std::size_t> unit_tensors(std::size_t u) const { return units_[u]; }
  void initialize(std::size_t, std::size_t, std::span<double> w) {
    for (double& v : w) v = init_;
  }
  cudaStream_t stream() const noexcept { return stream_.get(); }

  double forward_backward(const batch_type& batch, sharded::device_unit_access<double>& units) {
    const std::size_t count = batch.second - batch.first;
    const unsigned blocks = static_cast<unsigned>((count + 127) / 128);
    unit_residuals_start<<<blocks, 128, 0, stream()>>>(y_.data(), batch.first, count, err_.data());
    for (std::size_t u = 0, j0 = 0; u < units_.size(); ++u) {
      for (std::size_t k = 0; k < units_[u].size(); j0 += units_[u][k++]) {
        const device_span<const double> w = units.parameters(u, k);
        unit_residuals_add<<<blocks, 128, 0, stream()>>>(x_.data(), w.data(), dim_, batch.first, count, j0, w.size(),
                                                          err_.data());
        cuda::check(cudaGetLastError(), "unit_residuals_add launch");
      }
      units.forward_done(u);
    }
    for (std::size_t u = units_.size(), j_end = dim_; u-- > 0;) {
      (void)units.parameters(u, 0);  // a real layer's backward reads its weights: gathered again
      std::size_t j0 = j_end;
      for (std::size_t k = units_[u].size(); k-- > 0;) j0 -= units_[u][k];
      j_end = j0;
      for (std::size_t k = 0; k < units_[u].size(); j0 += units_[u][k++]) {
        const device_span<double> g = units.gradients(u, k);
        unit_gradient<<<static_cast<unsigned>((g.size() + 127) / 128), 128, 0, stream()>>>(
            x_.data(), err_.data(), dim_, batch.first, count, j0, g.size(), g.data());
        cuda::check(cudaGetLastError(), "unit_gradient launch");
      }
      units.backward_done(u);
    }
    std::vector<double> err(count);
    cuda::check(cudaMemcpyAsync(err.data(), err_.data(), count * sizeof(double), cudaMemcpyDeviceToHost, stream()),
                "D2H");
    cuda::check(cudaStreamSynchronize(stream()), "sync");
    double loss = 0;
    for (double e : err) loss += 0.5 * e * e / static_cast<double>(count);
    return loss;
  }

 private:
  std::vector<std::vector<std::size_t>> units_;
  std::size_t dim_;
  double init_;
  cuda::stream stream_;
  cuda::device_buffer<double> x_, y_, err_;
};

static_assert(sharded::device_unit_model<device_unit_model>);

}  // namespace dtrain::testing
