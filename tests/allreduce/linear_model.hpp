#pragma once
// A test model: least-squares linear regression whose weights are split into tensors of given
// sizes, so a trainer sees several tensors and buckets. Gradients are reported ready in an order
// the test chooses (reverse by default), to exercise bucket launching.

#include <cstddef>
#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "dtrain/concepts/model.hpp"

namespace dtrain::testing {

/// Samples x ~ N(0, 1) of `dim` features and y = x . truth + noise, from `seed`.
struct regression_data {
  std::size_t dim = 0;
  std::vector<double> x, y;

  regression_data(std::size_t d, std::size_t samples, unsigned seed) : dim(d), x(d * samples), y(samples) {
    std::mt19937 gen(seed);
    std::normal_distribution<double> n01;
    std::vector<double> truth(d);
    std::mt19937 truth_gen(7);
    for (double& t : truth) t = n01(truth_gen);
    for (std::size_t s = 0; s < samples; ++s) {
      double dot = 0;
      for (std::size_t j = 0; j < d; ++j) dot += (x[s * d + j] = n01(gen)) * truth[j];
      y[s] = dot + 0.1 * n01(gen);
    }
  }
  std::size_t samples() const { return y.size(); }
};

/// Mean least-squares gradient of `w` over samples [begin, end) of `data`; returns the mean loss.
inline double least_squares_gradient(const regression_data& data, std::span<const double> w, std::size_t begin,
                                     std::size_t end, std::span<double> grad) {
  std::fill(grad.begin(), grad.end(), 0.0);
  double loss = 0;
  const double n = static_cast<double>(end - begin);
  for (std::size_t s = begin; s < end; ++s) {
    const double* x = &data.x[s * data.dim];
    double err = -data.y[s];
    for (std::size_t j = 0; j < data.dim; ++j) err += x[j] * w[j];
    loss += 0.5 * err * err / n;
    for (std::size_t j = 0; j < data.dim; ++j) grad[j] += err * x[j] / n;
  }
  return loss;
}

class linear_model {
 public:
  using value_type = double;
  using batch_type = std::pair<std::size_t, std::size_t>;  // [begin, end) of this rank's data

  /// With `gaps`, tensors are stored apart (a spare element between them), so the trainer must
  /// copy them into its bucket buffers; without, they share one flat buffer and are reduced in
  /// place.
  linear_model(std::vector<std::size_t> tensor_sizes, const regression_data& data, double init, bool gaps = false)
      : sizes_(std::move(tensor_sizes)), data_(&data) {
    const std::size_t total = std::accumulate(sizes_.begin(), sizes_.end(), std::size_t{0});
    const std::size_t gap = gaps ? 1 : 0;
    for (std::size_t i = 0, at = 0; i < sizes_.size(); at += sizes_[i++] + gap) offsets_.push_back(at);
    w_.assign(total + gap * sizes_.size(), init);
    g_.assign(w_.size(), 0.0);
    dense_w_.resize(total);
    dense_g_.resize(total);
    order_.resize(sizes_.size());
    std::iota(order_.rbegin(), order_.rend(), std::size_t{0});
  }

  std::size_t tensor_count() const noexcept { return sizes_.size(); }
  std::span<double> parameters(std::size_t i) { return std::span(w_).subspan(offsets_[i], sizes_[i]); }
  std::span<double> gradients(std::size_t i) { return std::span(g_).subspan(offsets_[i], sizes_[i]); }

  double forward_backward(const batch_type& batch, gradient_ready ready) {
    dense_w_ = weights();
    const double loss = least_squares_gradient(*data_, dense_w_, batch.first, batch.second, dense_g_);
    for (std::size_t i = 0, at = 0; i < sizes_.size(); at += sizes_[i++]) {
      std::copy_n(dense_g_.begin() + static_cast<std::ptrdiff_t>(at), sizes_[i], gradients(i).begin());
    }
    for (std::size_t k = 0; k < order_.size(); ++k) {
      if (k == order_.size() / 2 && midway) midway();
      if (unused && unused(order_[k])) {  // a branch not taken: no gradient, and no report
        std::fill(gradients(order_[k]).begin(), gradients(order_[k]).end(), std::numeric_limits<double>::quiet_NaN());
        continue;
      }
      ready(order_[k]);
    }
    return loss;
  }

  /// The order gradients are reported in (default: last tensor first).
  std::vector<std::size_t>& ready_order() { return order_; }
  /// The weights as one dense vector (without the gaps).
  std::vector<double> weights() {
    std::vector<double> dense;
    for (std::size_t i = 0; i < sizes_.size(); ++i)
      dense.insert(dense.end(), parameters(i).begin(), parameters(i).end());
    return dense;
  }
  std::function<void()> midway;  // run inside forward_backward, after half the reports
  std::function<bool(std::size_t tensor)> unused;  // tensors this pass does not use

 private:
  std::vector<std::size_t> sizes_, offsets_, order_;
  const regression_data* data_;
  std::vector<double> w_, g_, dense_w_, dense_g_;
};

static_assert(model<linear_model>);

}  // namespace dtrain::testing
