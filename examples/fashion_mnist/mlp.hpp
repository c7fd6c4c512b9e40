#pragma once
// A multi-layer perceptron (ReLU hidden layers, softmax cross-entropy) written with Eigen, as a
// model of dtrain's `model` concept: its tensors are each layer's weight and bias, and its
// backward pass reports each layer's gradients as soon as they are computed, last layer first,
// so the trainer can start averaging them while the earlier layers are still being computed.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include <dtrain/concepts/model.hpp>

#include "dataset.hpp"

namespace fashion_mnist {

class mlp {
 public:
  using value_type = float;
  using batch_type = std::span<const std::size_t>;  // indices into the training split

  /// Layers of `widths` (784, 256, 128, 10 for the recipe), initialised like PyTorch's Linear:
  /// weights and biases uniform in +-1/sqrt(fan_in).
  mlp(std::vector<int> widths, const split& train, std::uint64_t seed) : widths_(std::move(widths)), train_(&train) {
    // One flat buffer for all parameters and one for all gradients (like DDP's
    // gradient_as_bucket_view): the trainer then reduces a bucket in place, without copies.
    for (std::size_t l = 0; l + 1 < widths_.size(); ++l) {
      const auto in = static_cast<std::size_t>(widths_[l]), out = static_cast<std::size_t>(widths_[l + 1]);
      for (std::size_t n : {in * out, out}) {
        offsets_.push_back(flat_params_.size());
        sizes_.push_back(n);
        flat_params_.resize(flat_params_.size() + n);
      }
    }
    flat_grads_.assign(flat_params_.size(), 0.0f);
    std::mt19937_64 gen(seed);
    for (std::size_t l = 0; l < layers(); ++l) {
      const auto in = static_cast<float>(widths_[l]);
      std::uniform_real_distribution<float> u(-1.0f / std::sqrt(in), 1.0f / std::sqrt(in));
      for (std::size_t t : {2 * l, 2 * l + 1}) {
        for (float& w : parameters(t)) w = u(gen);
      }
    }
    acts_.resize(widths_.size());
    deltas_.resize(widths_.size());
  }

  std::size_t tensor_count() const noexcept { return sizes_.size(); }
  std::span<float> parameters(std::size_t i) { return std::span(flat_params_).subspan(offsets_[i], sizes_[i]); }
  std::span<float> gradients(std::size_t i) { return std::span(flat_grads_).subspan(offsets_[i], sizes_[i]); }
  std::size_t layers() const noexcept { return widths_.size() - 1; }
  /// All parameters, and all gradients, as one buffer each (tensor i at its offset).
  std::span<float> flat_parameters() noexcept { return flat_params_; }
  std::span<float> flat_gradients() noexcept { return flat_grads_; }

  /// Mean softmax cross-entropy over `batch`; gradients overwritten; `ready` called per tensor.
  double forward_backward(const batch_type& batch, dtrain::gradient_ready ready) {
    const auto b = static_cast<Eigen::Index>(batch.size());
    matrix& x = acts_[0];
    x.resize(b, widths_[0]);
    for (Eigen::Index r = 0; r < b; ++r) {
      x.row(r) = Eigen::Map<const row>(&train_->pixels[batch[static_cast<std::size_t>(r)] * pixels_per_image],
                                       widths_[0]);
    }
    forward(b);
    // Softmax cross-entropy; its gradient w.r.t. the logits is (p - onehot) / b.
    matrix& z = acts_.back();
    matrix& dz = deltas_.back();
    dz.resize(b, z.cols());
    double loss = 0;
    for (Eigen::Index r = 0; r < b; ++r) {
      const float top = z.row(r).maxCoeff();
      dz.row(r) = (z.row(r).array() - top).exp();
      const float sum = dz.row(r).sum();
      const int label = train_->labels[batch[static_cast<std::size_t>(r)]];
      loss += std::log(sum) - (z(r, label) - top);
      dz.row(r) /= sum;
      dz(r, label) -= 1.0f;
    }
    dz /= static_cast<float>(b);
    for (std::size_t l = layers(); l-- > 0;) {  // last layer first
      const matrix& in = acts_[l];
      const matrix& delta = deltas_[l + 1];
      weights_map(gradients(2 * l), l).noalias() = in.transpose() * delta;
      bias_map(gradients(2 * l + 1)).noalias() = delta.colwise().sum();
      ready(2 * l + 1);
      ready(2 * l);
      if (l > 0) {  // through this layer's weights, then the ReLU before it
        deltas_[l].noalias() = delta * weights_map(parameters(2 * l), l).transpose();
        deltas_[l].array() *= (acts_[l].array() > 0.0f).cast<float>();
      }
    }
    return loss / static_cast<double>(b);
  }

  /// How many of samples [first, first + n) of `data` the model classifies correctly, and the
  /// sum of their cross-entropy losses.
  std::pair<std::size_t, double> evaluate(const split& data, std::size_t first, std::size_t n) {
    const auto b = static_cast<Eigen::Index>(n);
    acts_[0] = Eigen::Map<const matrix>(&data.pixels[first * pixels_per_image], b, widths_[0]);
    forward(b);
    std::size_t hits = 0;
    double loss = 0;
    for (Eigen::Index r = 0; r < b; ++r) {
      Eigen::Index best = 0;
      const auto z = acts_.back().row(r);
      const float top = z.maxCoeff(&best);
      const int label = data.labels[first + static_cast<std::size_t>(r)];
      loss += std::log((z.array() - top).exp().sum()) - (z(label) - top);
      hits += best == label ? 1 : 0;
    }
    return {hits, loss};
  }

 private:
  using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using row = Eigen::Matrix<float, 1, Eigen::Dynamic>;

  Eigen::Map<matrix> weights_map(std::span<float> w, std::size_t l) const {
    return {w.data(), widths_[l], widths_[l + 1]};
  }
  Eigen::Map<row> bias_map(std::span<float> v) const {
    return {v.data(), static_cast<Eigen::Index>(v.size())};
  }

  // acts_[l + 1] = relu(acts_[l] * W_l + b_l); no ReLU on the logits.
  void forward(Eigen::Index b) {
    for (std::size_t l = 0; l < layers(); ++l) {
      matrix& out = acts_[l + 1];
      out.resize(b, widths_[l + 1]);
      out.noalias() = acts_[l] * weights_map(parameters(2 * l), l);
      out.rowwise() += bias_map(parameters(2 * l + 1));
      if (l + 1 < layers()) out = out.cwiseMax(0.0f);
    }
  }

  std::vector<int> widths_;
  const split* train_;
  // Aligned as Eigen aligns its own matrices: its vectorised sums start at the first aligned
  // element, so where malloc happened to put a buffer would otherwise change the last bits of
  // the gradients from one process layout to another.
  std::vector<float, Eigen::aligned_allocator<float>> flat_params_, flat_grads_;
  std::vector<std::size_t> offsets_, sizes_;
  std::vector<matrix> acts_, deltas_;
};

static_assert(dtrain::model<mlp>);

}  // namespace fashion_mnist
