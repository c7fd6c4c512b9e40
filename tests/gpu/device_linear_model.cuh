#pragma once
// The least-squares model of tests/allreduce/linear_model.hpp on the GPU: weights, gradients and
// data in device memory, one kernel per tensor's gradient (last tensor first), each reported
// ready as soon as it is enqueued, so the trainer's buckets overlap the remaining kernels.

#include <cstddef>
#include <numeric>
#include <utility>
#include <vector>

#include "../allreduce/linear_model.hpp"
#include "dtrain/cuda/runtime.hpp"
#include "dtrain/concepts/model.hpp"

namespace dtrain::testing {

// err[s] = x_s . w - y_s for the batch's samples.
__global__ void residuals(const double* x, const double* y, const double* w, std::size_t dim, std::size_t begin,
                          std::size_t count, double* err) {
  const std::size_t s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= count) return;
  const double* xs = x + (begin + s) * dim;
  double e = -y[begin + s];
  for (std::size_t j = 0; j < dim; ++j) e += xs[j] * w[j];
  err[s] = e;
}

// grad[k] = sum_s err[s] * x[s][first + k] / count, summed in sample order as the host does.
__global__ void gradient_slice(const double* x, const double* err, std::size_t dim, std::size_t begin,
                               std::size_t count, std::size_t first, std::size_t size, double* grad) {
  const std::size_t k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= size) return;
  const double n = static_cast<double>(count);
  double g = 0;
  for (std::size_t s = 0; s < count; ++s) g += err[s] * x[(begin + s) * dim + first + k] / n;
  grad[k] = g;
}

class device_linear_model {
 public:
  using value_type = double;
  using batch_type = std::pair<std::size_t, std::size_t>;

  /// With `gaps`, tensors sit apart in memory and go through the trainer's bucket buffer.
  device_linear_model(std::vector<std::size_t> sizes, const regression_data& data, double init, bool gaps)
      : sizes_(std::move(sizes)), dim_(data.dim), stream_() {
    const std::size_t gap = gaps ? 1 : 0;
    std::size_t at = 0;
    for (std::size_t s : sizes_) {
      offsets_.push_back(at);
      at += s + gap;
    }
    w_ = cuda::device_buffer<double>(at);
    g_ = cuda::device_buffer<double>(at);
    std::vector<double> w(at, init);
    upload(w_, w);
    x_ = cuda::device_buffer<double>(data.x.size());
    y_ = cuda::device_buffer<double>(data.y.size());
    err_ = cuda::device_buffer<double>(data.y.size());
    upload(x_, data.x);
    upload(y_, data.y);
  }

  std::size_t tensor_count() const noexcept { return sizes_.size(); }
  device_span<double> parameters(std::size_t i) { return {w_.data() + offsets_[i], sizes_[i]}; }
  device_span<double> gradients(std::size_t i) { return {g_.data() + offsets_[i], sizes_[i]}; }
  cudaStream_t stream() const noexcept { return stream_.get(); }

  double forward_backward(const batch_type& batch, gradient_ready ready) {
    const std::size_t count = batch.second - batch.first;
    const std::vector<double> w = weights();  // dense, for the residual kernel
    dense_w_ = cuda::device_buffer<double>(w.size());
    upload(dense_w_, w);
    residuals<<<1, 256, 0, stream()>>>(x_.data(), y_.data(), dense_w_.data(), dim_, batch.first, count, err_.data());
    for (std::size_t i = sizes_.size(); i-- > 0;) {
      gradient_slice<<<(sizes_[i] + 127) / 128, 128, 0, stream()>>>(x_.data(), err_.data(), dim_, batch.first, count,
                                                                     dense_offset(i), sizes_[i], gradients(i).data());
      cuda::check(cudaGetLastError(), "gradient_slice launch");
      ready(i);
    }
    std::vector<double> err(count);
    cuda::check(cudaMemcpyAsync(err.data(), err_.data(), count * sizeof(double), cudaMemcpyDeviceToHost, stream()),
                "D2H");
    cuda::check(cudaStreamSynchronize(stream()), "sync");
    double loss = 0;
    for (double e : err) loss += 0.5 * e * e / static_cast<double>(count);
    return loss;
  }

  /// The weights as one dense host vector (waits for the model's stream).
  std::vector<double> weights() const {
    cuda::check(cudaStreamSynchronize(stream()), "sync");
    std::vector<double> dense;
    for (std::size_t i = 0; i < sizes_.size(); ++i) {
      std::vector<double> t(sizes_[i]);
      cuda::check(cudaMemcpy(t.data(), w_.data() + offsets_[i], t.size() * sizeof(double), cudaMemcpyDeviceToHost),
                  "D2H");
      dense.insert(dense.end(), t.begin(), t.end());
    }
    return dense;
  }

 private:
  std::size_t dense_offset(std::size_t i) const {
    return std::accumulate(sizes_.begin(), sizes_.begin() + static_cast<std::ptrdiff_t>(i), std::size_t{0});
  }
  static void upload(cuda::device_buffer<double>& d, const std::vector<double>& h) {
    cuda::check(cudaMemcpy(d.data(), h.data(), h.size() * sizeof(double), cudaMemcpyHostToDevice), "H2D");
  }

  std::vector<std::size_t> sizes_, offsets_;
  std::size_t dim_;
  cuda::stream stream_;
  cuda::device_buffer<double> w_, g_, x_, y_, err_, dense_w_;
};

}  // namespace dtrain::testing
