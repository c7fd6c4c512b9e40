#pragma once
// One pipeline stage of a Fashion-MNIST MLP (ReLU hidden layers, softmax cross-entropy), its
// linear layers tensor-parallel over a group: layer l is column-parallel for even l and
// row-parallel for odd l (Megatron's MLP block pairs), so a group of one is a plain MLP and a
// larger group needs one allreduce per block and direction. The products run on Eigen.
//
// Layer l's whole weights are drawn from (seed, l) alone, like PyTorch's Linear (uniform in
// +-1/sqrt(fan_in)), and each rank keeps its slice: every split of the model starts from the
// same network as the one-process run.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include <dtrain/concepts/stage.hpp>
#include <dtrain/tensor_parallel/linear.hpp>

#include "layers.hpp"
#include "settings.hpp"

namespace fashion_mnist {

/// The tensor-parallel layers' products on Eigen (row-major maps, no copies).
struct eigen_kernels {
  template <class T>
  using matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

  template <class T>
  static void multiply_transposed(std::span<const T> x, std::span<const T> w, std::size_t in, std::size_t out,
                                  std::span<T> y) {
    if (in == 0 || out == 0) return;
    const auto b = static_cast<Eigen::Index>(x.size() / in);
    Eigen::Map<matrix<T>> ym(y.data(), b, static_cast<Eigen::Index>(out));
    ym.noalias() += Eigen::Map<const matrix<T>>(x.data(), b, static_cast<Eigen::Index>(in)) *
                    Eigen::Map<const matrix<T>>(w.data(), static_cast<Eigen::Index>(out), static_cast<Eigen::Index>(in))
                        .transpose();
  }

  template <class T>
  static void linear_backward(std::span<const T> x, std::span<const T> dy, std::span<const T> w, std::size_t in,
                              std::size_t out, std::span<T> gw, std::span<T> dx) {
    if (out == 0) return;
    const auto b = static_cast<Eigen::Index>(dy.size() / out), i = static_cast<Eigen::Index>(in),
               o = static_cast<Eigen::Index>(out);
    Eigen::Map<const matrix<T>> dym(dy.data(), b, o);
    Eigen::Map<matrix<T>>(gw.data(), o, i).noalias() += dym.transpose() * Eigen::Map<const matrix<T>>(x.data(), b, i);
    if (!dx.empty())
      Eigen::Map<matrix<T>>(dx.data(), b, i).noalias() = dym * Eigen::Map<const matrix<T>>(w.data(), o, i);
  }
};

template <class Collective>
class parallel_stage {
 public:
  using value_type = float;
  using column = dtrain::tensor_parallel::column_parallel_linear<float, Collective, eigen_kernels>;
  using row = dtrain::tensor_parallel::row_parallel_linear<float, Collective, eigen_kernels>;

  /// Layers [first, last) of the MLP `widths`, tensor-parallel over `tp` (both outlive the
  /// stage), reading samples from `source`.
  parallel_stage(Collective& tp, std::vector<int> widths, int first, int last, const sample_source& source,
                 std::uint64_t seed)
      : widths_(std::move(widths)), first_(first), last_(last), source_(&source),
        layers_(tp, widths_, first, last, seed) {}

  std::size_t tensor_count() const noexcept { return 2 * static_cast<std::size_t>(last_ - first_); }
  std::span<float> parameters(std::size_t i) { return layers_.tensor(i, false); }
  std::span<float> gradients(std::size_t i) { return layers_.tensor(i, true); }
  std::size_t input_size() const noexcept {
    return first_ == 0 ? 0 : source_->micro_batch_size * static_cast<std::size_t>(widths_[first_]);
  }
  std::size_t output_size() const noexcept {
    return last_ == layers() ? 0 : source_->micro_batch_size * static_cast<std::size_t>(widths_[last_]);
  }
  /// Correct predictions of the last stage's forwards since the last `reset_hits`.
  std::size_t hits() const noexcept { return hits_; }
  void reset_hits() noexcept { hits_ = 0; }

  double forward(const dtrain::micro_batch& mb, std::span<const float> in, std::span<float> out) {
    std::vector<std::vector<float>> acts;  // each layer's input, then the last output
    acts.push_back(first_ == 0 ? images_of(*source_, mb.index) : std::vector<float>(in.begin(), in.end()));
    const std::size_t b = source_->micro_batch_size;
    for (int l = first_; l < last_; ++l) {
      std::vector<float> y(b * layers_.output_width(l, widths_));
      if (l % 2 == 0) layers_.column_at(l).forward(acts.back(), y);
      else layers_.row_at(l).forward(acts.back(), y);
      if (l + 1 < layers()) {
        for (float& v : y) v = std::max(v, 0.0f);
      }
      acts.push_back(std::move(y));
    }
    double loss = 0;
    if (last_ == layers()) {
      loss = softmax_cross_entropy(mb, acts.back(), nullptr);
    } else {
      std::copy(acts.back().begin(), acts.back().end(), out.begin());
    }
    saved_[mb.index] = std::move(acts);
    return loss;
  }

  void backward(const dtrain::micro_batch& mb, std::span<const float> out_grad, std::span<float> in_grad) {
    auto acts = std::move(saved_.at(mb.index));
    saved_.erase(mb.index);
    std::vector<float> delta(acts.back().size());
    if (last_ == layers()) softmax_cross_entropy(mb, acts.back(), &delta);
    else std::copy(out_grad.begin(), out_grad.end(), delta.begin());
    for (int l = last_ - 1; l >= first_; --l) {
      const auto& x = acts[static_cast<std::size_t>(l - first_)];
      const auto& y = acts[static_cast<std::size_t>(l - first_ + 1)];
      if (l + 1 < layers()) {
        for (std::size_t i = 0; i < delta.size(); ++i) delta[i] = y[i] > 0.0f ? delta[i] : 0.0f;
      }
      std::vector<float> dx(l > 0 ? x.size() : 0);  // the model's input needs no gradient
      if (l % 2 == 0) layers_.column_at(l).backward(x, delta, dx);
      else layers_.row_at(l).backward(x, delta, dx);
      delta = std::move(dx);
    }
    std::copy(delta.begin(), delta.end(), in_grad.begin());
  }

  void discard(const dtrain::micro_batch& mb) { saved_.erase(mb.index); }

 private:
  int layers() const noexcept { return static_cast<int>(widths_.size()) - 1; }

  // Mean softmax cross-entropy of the logits `z` against the micro-batch's labels; with `dz`,
  // its gradient (p - onehot) / b. Counts correct predictions.
  double softmax_cross_entropy(const dtrain::micro_batch& mb, const std::vector<float>& z, std::vector<float>* dz) {
    const auto labels = samples_of(*source_, mb.index);
    const std::size_t k = static_cast<std::size_t>(classes), b = labels.size();
    double loss = 0;
    for (std::size_t r = 0; r < b; ++r) {
      const float* zr = &z[r * k];
      const std::size_t best = static_cast<std::size_t>(std::max_element(zr, zr + k) - zr);
      const float top = zr[best];
      const int label = source_->data->labels[labels[r]];
      hits_ += dz == nullptr && static_cast<int>(best) == label ? 1 : 0;
      double sum = 0;
      for (std::size_t c = 0; c < k; ++c) sum += std::exp(double(zr[c] - top));
      loss += std::log(sum) - double(zr[label] - top);
      if (dz != nullptr) {
        for (std::size_t c = 0; c < k; ++c) {
          (*dz)[r * k + c] = float((std::exp(double(zr[c] - top)) / sum - (int(c) == label ? 1.0 : 0.0)) / double(b));
        }
      }
    }
    return loss / static_cast<double>(b);
  }

  std::vector<int> widths_;
  int first_, last_;
  const sample_source* source_;
  stage_layers<column, row> layers_;
  std::map<int, std::vector<std::vector<float>>> saved_;
  std::size_t hits_ = 0;
};

}  // namespace fashion_mnist
