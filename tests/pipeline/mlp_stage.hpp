#pragma once
// A `stage` for the pipeline tests: layers [first, last) of a tanh MLP with widths w[0..L] (the
// last layer linear, then half the squared error against synthetic targets, averaged over the
// micro-batch). Layer l's weights depend only on (seed, l), and a micro-batch's samples only on
// its global index, so every partition of the network into stages, every schedule and the
// serial reference start from the same weights and see the same data.

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include "dtrain/concepts/stage.hpp"

namespace dtrain::testing {

/// A micro-batch's inputs (salt 0.37) or targets (0.23), `batch` x `width`: a function of its
/// global index only, which counts every replica's micro-batches of every step in order.
template <class T>
std::vector<T> synthetic_samples(const micro_batch& mb, int replica, int replicas, int batch, int width, double salt) {
  const auto global =
      static_cast<double>((mb.step * static_cast<std::uint64_t>(replicas) + static_cast<std::uint64_t>(replica)) *
                              static_cast<std::uint64_t>(mb.count) +
                          static_cast<std::uint64_t>(mb.index));
  std::vector<T> x(static_cast<std::size_t>(batch) * static_cast<std::size_t>(width));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = T(std::sin(salt * (global * 31.0 + static_cast<double>(i)) + salt));
  return x;
}

template <std::floating_point T>
class mlp_stage {
 public:
  using value_type = T;

  /// Layers [first, last) of the MLP `widths`, on micro-batches of `batch` samples; this
  /// replica is `replica` of `replicas` (each sees its own micro-batches).
  mlp_stage(std::vector<int> widths, int first, int last, int batch, int replica = 0, int replicas = 1)
      : widths_(std::move(widths)), first_(first), last_(last), batch_(batch), replica_(replica), replicas_(replicas) {
    for (int l = first_; l < last_; ++l) {
      const auto in = static_cast<std::size_t>(widths_[l]), out = static_cast<std::size_t>(widths_[l + 1]);
      std::vector<T> w(in * out), b(out);
      for (std::size_t i = 0; i < w.size(); ++i)
        w[i] = T(0.6 * std::sin(1.3 * l + 0.7 * static_cast<double>(i)) / std::sqrt(double(in)));
      for (std::size_t i = 0; i < b.size(); ++i) b[i] = T(0.1 * std::cos(0.9 * l + 0.5 * static_cast<double>(i)));
      params_.push_back(std::move(w));
      params_.push_back(std::move(b));
    }
    for (const auto& p : params_) grads_.emplace_back(p.size(), T(0));
  }

  std::size_t tensor_count() const noexcept { return params_.size(); }
  std::span<T> parameters(std::size_t i) { return params_[i]; }
  std::span<T> gradients(std::size_t i) { return grads_[i]; }
  std::size_t input_size() const noexcept { return first_ == 0 ? 0 : width_at(first_); }
  std::size_t output_size() const noexcept { return last_ == layers() ? 0 : width_at(last_); }
  /// How many micro-batches' activations this stage holds.
  std::size_t kept() const noexcept { return saved_.size(); }

  double forward(const micro_batch& mb, std::span<const T> in, std::span<T> out) {
    std::vector<std::vector<T>> acts;
    acts.push_back(first_ == 0 ? samples(mb, widths_[0], 0.37) : std::vector<T>(in.begin(), in.end()));
    for (int l = first_; l < last_; ++l) acts.push_back(layer_forward(l, acts.back()));
    double loss = 0;
    if (last_ == layers()) {
      const std::vector<T> target = samples(mb, widths_.back(), 0.23);
      for (std::size_t i = 0; i < target.size(); ++i)
        loss += 0.5 * double(acts.back()[i] - target[i]) * double(acts.back()[i] - target[i]);
      loss /= batch_;
    } else {
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = acts.back()[i];  // GCC 12 warns falsely on std::copy here
    }
    saved_[mb.index] = std::move(acts);
    return loss;
  }

  void backward(const micro_batch& mb, std::span<const T> out_grad, std::span<T> in_grad) {
    auto acts = std::move(saved_.at(mb.index));
    saved_.erase(mb.index);
    std::vector<T> delta;
    if (last_ == layers()) {
      const std::vector<T> target = samples(mb, widths_.back(), 0.23);
      delta.resize(target.size());
      for (std::size_t i = 0; i < delta.size(); ++i) delta[i] = (acts.back()[i] - target[i]) / T(batch_);
    } else {
      delta.assign(out_grad.begin(), out_grad.end());
    }
    for (int l = last_ - 1; l >= first_; --l) delta = layer_backward(l, acts[l - first_], acts[l - first_ + 1], delta);
    for (std::size_t i = 0; i < in_grad.size(); ++i) in_grad[i] = delta[i];
  }

  void discard(const micro_batch& mb) { saved_.erase(mb.index); }

 private:
  int layers() const noexcept { return static_cast<int>(widths_.size()) - 1; }
  std::size_t width_at(int l) const noexcept {
    return static_cast<std::size_t>(batch_) * static_cast<std::size_t>(widths_[l]);
  }

  std::vector<T> samples(const micro_batch& mb, int width, double salt) const {
    return synthetic_samples<T>(mb, replica_, replicas_, batch_, width, salt);
  }

  const std::vector<T>& weight(int l) const { return params_[2 * static_cast<std::size_t>(l - first_)]; }
  const std::vector<T>& bias(int l) const { return params_[2 * static_cast<std::size_t>(l - first_) + 1]; }

  // y = x W^T + b, then tanh except on the network's last layer.
  std::vector<T> layer_forward(int l, const std::vector<T>& x) const {
    const int in = widths_[l], out = widths_[l + 1];
    std::vector<T> y(static_cast<std::size_t>(batch_) * static_cast<std::size_t>(out));
    for (int s = 0; s < batch_; ++s) {
      for (int o = 0; o < out; ++o) {
        T z = bias(l)[o];
        for (int i = 0; i < in; ++i) z += x[s * in + i] * weight(l)[o * in + i];
        y[s * out + o] = l == layers() - 1 ? z : std::tanh(z);
      }
    }
    return y;
  }

  // Adds layer l's parameter gradients; @returns the gradient with respect to its input.
  std::vector<T> layer_backward(int l, const std::vector<T>& x, const std::vector<T>& y, std::vector<T> delta) {
    const int in = widths_[l], out = widths_[l + 1];
    if (l != layers() - 1) {
      for (std::size_t i = 0; i < delta.size(); ++i) delta[i] *= T(1) - y[i] * y[i];
    }
    auto& gw = grads_[2 * static_cast<std::size_t>(l - first_)];
    auto& gb = grads_[2 * static_cast<std::size_t>(l - first_) + 1];
    std::vector<T> dx(static_cast<std::size_t>(batch_) * static_cast<std::size_t>(in), T(0));
    for (int s = 0; s < batch_; ++s) {
      for (int o = 0; o < out; ++o) {
        const T d = delta[s * out + o];
        gb[o] += d;
        for (int i = 0; i < in; ++i) {
          gw[o * in + i] += d * x[s * in + i];
          dx[s * in + i] += d * weight(l)[o * in + i];
        }
      }
    }
    return dx;
  }

  std::vector<int> widths_;
  int first_, last_, batch_, replica_, replicas_;
  std::vector<std::vector<T>> params_, grads_;
  std::map<int, std::vector<std::vector<T>>> saved_;  // micro-batch -> each layer's input, then the output
};

static_assert(stage<mlp_stage<double>>);

}  // namespace dtrain::testing
