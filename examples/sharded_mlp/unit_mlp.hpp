#pragma once
// A deep MLP (ReLU hidden layers, softmax cross-entropy) on Fashion-MNIST as a `unit_model`: each
// layer is a unit of two tensors (its weights, in x out, row-major, and its bias), and the model
// holds none of them. Its pass asks the sharded trainer for a layer's parameters just before the
// layer runs and lets them go right after, so a rank never holds more than the trainer's
// `limit_all_gathers` layers at once.
//
// T is the parameters' and gradients' type: float, or dtrain::bfloat16 for mixed precision. The
// arithmetic is float either way; a bfloat16 layer is widened into a float scratch matrix first
// (what a CPU without bf16 matrix units does) and its gradients are rounded back.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include <dtrain/concepts/unit_model.hpp>
#include <dtrain/core/element.hpp>

#include "../fashion_mnist/dataset.hpp"

namespace sharded_mlp {

template <class T>
class unit_mlp {
 public:
  using value_type = T;
  using batch_type = std::span<const std::size_t>;  // indices into the training split

  unit_mlp(std::vector<int> widths, const fashion_mnist::split& train, std::uint64_t seed)
      : widths_(std::move(widths)), train_(&train), seed_(seed), acts_(widths_.size()), deltas_(widths_.size()) {}

  std::size_t unit_count() const noexcept { return widths_.size() - 1; }
  std::vector<std::size_t> unit_tensors(std::size_t u) const { return {fan_in(u) * fan_out(u), fan_out(u)}; }
  std::size_t parameter_count() const {
    std::size_t n = 0;
    for (std::size_t u = 0; u < unit_count(); ++u) n += fan_in(u) * fan_out(u) + fan_out(u);
    return n;
  }

  /// As PyTorch's Linear: uniform in +-1/sqrt(fan_in), from a generator of its own per tensor
  /// (the trainer may ask for the units in any order).
  void initialize(std::size_t u, std::size_t k, std::span<float> w) const {
    std::mt19937_64 gen(seed_ * 1000003 + 2 * u + k);
    const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in(u)));
    std::uniform_real_distribution<float> pick(-bound, bound);
    for (float& x : w) x = pick(gen);
  }

  /// Mean softmax cross-entropy over `batch`, its gradient written unit by unit, last first.
  double forward_backward(const batch_type& batch, dtrain::unit_access<T>& units) {
    const auto b = static_cast<Eigen::Index>(batch.size());
    acts_[0].resize(b, widths_[0]);
    for (Eigen::Index r = 0; r < b; ++r) {
      const std::size_t image = batch[static_cast<std::size_t>(r)] * fashion_mnist::pixels_per_image;
      acts_[0].row(r) = Eigen::Map<const row>(&train_->pixels[image], widths_[0]);
    }
    for (std::size_t u = 0; u < unit_count(); ++u) {
      layer(u, units.parameters(u, 0), units.parameters(u, 1), b);
      units.forward_done(u);
    }
    const double loss = softmax_loss(
        b, [&](Eigen::Index r) { return static_cast<int>(train_->labels[batch[static_cast<std::size_t>(r)]]); });
    for (std::size_t u = unit_count(); u-- > 0;) {
      const matrix& delta = deltas_[u + 1];
      store(units.gradients(u, 0), acts_[u].transpose() * delta);
      store(units.gradients(u, 1), delta.colwise().sum());
      if (u > 0) {  // through this layer's weights, then the ReLU before it
        deltas_[u].noalias() = delta * weights(units.parameters(u, 0), u).transpose();
        deltas_[u].array() *= (acts_[u].array() > 0.0f).template cast<float>();
      }
      units.backward_done(u);
    }
    return loss;
  }

  /// Samples [first, first + n) of `data`: how many the model classifies correctly, and the sum
  /// of their losses. `unit(u)` returns layer u's parameters, whole (the trainer's
  /// `unit_parameters`); each is asked for once and dropped before the next.
  template <class Gather>
  std::pair<std::size_t, double> evaluate(const fashion_mnist::split& data, std::size_t first, std::size_t n,
                                          Gather&& unit) {
    const auto b = static_cast<Eigen::Index>(n);
    acts_[0] = Eigen::Map<const matrix>(data.pixels.data() + first * fashion_mnist::pixels_per_image, b, widths_[0]);
    for (std::size_t u = 0; u < unit_count(); ++u) {
      const std::vector<float> whole = unit(u);
      const std::span<const float> w(whole);
      layer(u, w.first(fan_in(u) * fan_out(u)), w.subspan(fan_in(u) * fan_out(u)), b);
    }
    std::size_t hits = 0;
    const double loss = softmax_loss(b, [&](Eigen::Index r) {
      const int label = data.labels[first + static_cast<std::size_t>(r)];
      Eigen::Index best = 0;
      acts_.back().row(r).maxCoeff(&best);
      hits += best == label ? 1 : 0;
      return label;
    });
    return {hits, loss * static_cast<double>(n)};
  }

 private:
  using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using row = Eigen::Matrix<float, 1, Eigen::Dynamic>;

  std::size_t fan_in(std::size_t u) const { return static_cast<std::size_t>(widths_[u]); }
  std::size_t fan_out(std::size_t u) const { return static_cast<std::size_t>(widths_[u + 1]); }

  // Layer u's weights as a float matrix: the gathered buffer itself in fp32, a widened copy in
  // bf16 (valid until the next call).
  template <class E>
  Eigen::Map<const matrix> weights(std::span<const E> w, std::size_t u) {
    const auto in = static_cast<Eigen::Index>(fan_in(u)), out = static_cast<Eigen::Index>(fan_out(u));
    if constexpr (std::is_same_v<E, float>) {
      return {w.data(), in, out};
    } else {
      wide_.resize(w.size());
      for (std::size_t i = 0; i < w.size(); ++i) wide_[i] = static_cast<float>(w[i]);
      return {wide_.data(), in, out};
    }
  }

  // acts_[u + 1] = relu(acts_[u] W + bias); no ReLU on the logits.
  template <class E>
  void layer(std::size_t u, std::span<const E> w, std::span<const E> bias, Eigen::Index b) {
    matrix& out = acts_[u + 1];
    out.resize(b, widths_[u + 1]);
    out.noalias() = acts_[u] * weights(w, u);
    for (Eigen::Index c = 0; c < out.cols(); ++c) {
      out.col(c).array() += static_cast<float>(bias[static_cast<std::size_t>(c)]);
    }
    if (u + 1 < unit_count()) out = out.cwiseMax(0.0f);
  }

  // Mean cross-entropy of the logits against label(r); leaves (softmax - onehot) / b, the loss's
  // gradient with respect to the logits, in deltas_.back().
  template <class Label>
  double softmax_loss(Eigen::Index b, Label&& label) {
    const matrix& z = acts_.back();
    matrix& dz = deltas_.back();
    dz.resize(b, z.cols());
    double loss = 0;
    for (Eigen::Index r = 0; r < b; ++r) {
      const int y = label(r);
      const float top = z.row(r).maxCoeff();
      dz.row(r) = (z.row(r).array() - top).exp();
      const float sum = dz.row(r).sum();
      loss += std::log(sum) - (z(r, y) - top);
      dz.row(r) /= sum;
      dz(r, y) -= 1.0f;
    }
    dz /= static_cast<float>(b);
    return loss / static_cast<double>(b);
  }

  // Writes a float expression into a gradient buffer of T, row-major.
  template <class Expr>
  void store(std::span<T> g, const Expr& value) {
    if constexpr (std::is_same_v<T, float>) {
      Eigen::Map<matrix>(g.data(), value.rows(), value.cols()).noalias() = value;
    } else {
      wide_grad_.resize(static_cast<Eigen::Index>(value.rows()), static_cast<Eigen::Index>(value.cols()));
      wide_grad_.noalias() = value;
      for (std::size_t i = 0; i < g.size(); ++i) g[i] = T(wide_grad_.data()[i]);
    }
  }

  std::vector<int> widths_;
  const fashion_mnist::split* train_;
  std::uint64_t seed_;
  std::vector<matrix> acts_, deltas_;
  std::vector<float> wide_;  // bf16: the running layer's weights, widened
  matrix wide_grad_;         // bf16: a gradient before it is rounded
};

static_assert(dtrain::unit_model<unit_mlp<float>>);
static_assert(dtrain::unit_model<unit_mlp<dtrain::bfloat16>>);

}  // namespace sharded_mlp
