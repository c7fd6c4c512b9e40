#pragma once
// A tensor-parallel `stage` for the hybrid tests: blocks [first, last) of a network of MLP
// blocks (column-parallel layer, tanh, row-parallel layer, tanh except after the last block),
// each block's hidden features split over the tensor-parallel group `tp`; then half the squared
// error against synthetic targets. Every tensor-parallel rank of a stage holds the whole
// activation between blocks, as Megatron's do. Block b's whole weights depend only on b, so
// with a group of one the stage is the unsplit network.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include "dtrain/concepts/stage.hpp"
#include "dtrain/tensor_parallel/linear.hpp"
#include "mlp_stage.hpp"

namespace dtrain::testing {

/// Block b maps dims[b] features through hidden[b] to dims[b + 1].
struct block_network {
  std::vector<int> dims{5, 6, 7, 6, 4};
  std::vector<int> hidden{7, 9, 8, 5};
  int blocks() const { return static_cast<int>(hidden.size()); }
};

/// Block b's whole weights: layer 0 (hidden x in) and 1 (out x hidden), weight and bias.
inline std::vector<double> whole_parameter(int b, int layer, bool bias, std::size_t n) {
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    v[i] = bias ? 0.1 * std::cos(0.9 * b + 0.4 * layer + 0.5 * double(i))
                : 0.5 * std::sin(1.3 * b + 0.8 * layer + 0.7 * double(i)) / std::sqrt(double(n) / 6.0);
  }
  return v;
}

template <class Collective>
class tp_mlp_stage {
 public:
  using value_type = double;
  using column = tensor_parallel::column_parallel_linear<double, Collective>;
  using row = tensor_parallel::row_parallel_linear<double, Collective>;

  tp_mlp_stage(Collective& tp, block_network net, int first, int last, int batch, int replica = 0, int replicas = 1)
      : net_(std::move(net)), first_(first), last_(last), batch_(batch), replica_(replica), replicas_(replicas) {
    for (int b = first_; b < last_; ++b) {
      const auto in = static_cast<std::size_t>(net_.dims[b]), h = static_cast<std::size_t>(net_.hidden[b]),
                 out = static_cast<std::size_t>(net_.dims[b + 1]);
      fc1_.emplace_back(tp, in, h);
      fc2_.emplace_back(tp, h, out);
      fc1_.back().load(whole_parameter(b, 0, false, h * in), whole_parameter(b, 0, true, h));
      fc2_.back().load(whole_parameter(b, 1, false, out * h), whole_parameter(b, 1, true, out));
    }
  }

  std::size_t tensor_count() const noexcept { return 4 * fc1_.size(); }
  std::span<double> parameters(std::size_t i) { return pick(i, false); }
  std::span<double> gradients(std::size_t i) { return pick(i, true); }
  std::size_t input_size() const noexcept { return first_ == 0 ? 0 : width(first_); }
  std::size_t output_size() const noexcept { return last_ == net_.blocks() ? 0 : width(last_); }

  double forward(const micro_batch& mb, std::span<const double> in, std::span<double> out) {
    std::vector<std::vector<double>> kept;  // per block: x, h, y
    std::vector<double> x = first_ == 0 ? samples(mb, net_.dims[0], 0.37) : std::vector<double>(in.begin(), in.end());
    for (int b = first_; b < last_; ++b) {
      auto& c = fc1_[b - first_];
      std::vector<double> h(static_cast<std::size_t>(batch_) * c.outputs().size);
      c.forward(x, h);
      for (double& v : h) v = std::tanh(v);
      std::vector<double> y(width(b + 1));
      fc2_[b - first_].forward(h, y);
      if (b != net_.blocks() - 1) {
        for (double& v : y) v = std::tanh(v);
      }
      kept.push_back(std::move(x));
      kept.push_back(h);
      x = y;
      kept.push_back(std::move(y));
    }
    double loss = 0;
    if (last_ == net_.blocks()) {
      const auto t = samples(mb, net_.dims.back(), 0.23);
      for (std::size_t i = 0; i < t.size(); ++i) loss += 0.5 * (x[i] - t[i]) * (x[i] - t[i]);
      loss /= batch_;
    } else {
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = x[i];
    }
    saved_[mb.index] = std::move(kept);
    return loss;
  }

  void backward(const micro_batch& mb, std::span<const double> out_grad, std::span<double> in_grad) {
    auto kept = std::move(saved_.at(mb.index));
    saved_.erase(mb.index);
    std::vector<double> delta;
    if (last_ == net_.blocks()) {
      const auto t = samples(mb, net_.dims.back(), 0.23);
      const auto& y = kept.back();
      for (std::size_t i = 0; i < t.size(); ++i) delta.push_back((y[i] - t[i]) / batch_);
    } else {
      delta.assign(out_grad.begin(), out_grad.end());
    }
    for (int b = last_ - 1; b >= first_; --b) {
      const auto k = static_cast<std::size_t>(b - first_) * 3;
      const auto &x = kept[k], &h = kept[k + 1], &y = kept[k + 2];
      if (b != net_.blocks() - 1) {
        for (std::size_t i = 0; i < delta.size(); ++i) delta[i] *= 1 - y[i] * y[i];
      }
      std::vector<double> dh(h.size()), dx(x.size());
      fc2_[b - first_].backward(h, delta, dh);
      for (std::size_t i = 0; i < dh.size(); ++i) dh[i] *= 1 - h[i] * h[i];
      // The first stage's input gradient is not wanted, but f's allreduce must still run on
      // every rank of the group alike; it is cheap at these sizes.
      fc1_[b - first_].backward(x, dh, dx);
      delta = std::move(dx);
    }
    for (std::size_t i = 0; i < in_grad.size(); ++i) in_grad[i] = delta[i];
  }

  void discard(const micro_batch& mb) { saved_.erase(mb.index); }

 private:
  std::size_t width(int b) const noexcept {
    return static_cast<std::size_t>(batch_) * static_cast<std::size_t>(net_.dims[b]);
  }

  std::span<double> pick(std::size_t i, bool grad) {
    auto& p = i % 4 < 2 ? fc1_[i / 4].parameters() : fc2_[i / 4].parameters();
    if (i % 2 == 0) return grad ? std::span<double>(p.weight_grad) : std::span<double>(p.weight);
    return grad ? std::span<double>(p.bias_grad) : std::span<double>(p.bias);
  }

  std::vector<double> samples(const micro_batch& mb, int width_of, double salt) const {
    return synthetic_samples<double>(mb, replica_, replicas_, batch_, width_of, salt);
  }

  block_network net_;
  int first_, last_, batch_, replica_, replicas_;
  std::vector<column> fc1_;
  std::vector<row> fc2_;
  std::map<int, std::vector<std::vector<double>>> saved_;
};

}  // namespace dtrain::testing
