#pragma once
// stage.hpp's pipeline stage on a device: the same MLP (ReLU hidden layers, softmax cross-entropy,
// Megatron's column/row pairs over the tensor-parallel group), its weights, gradients and
// activations in Thrust's device memory, its products the `Kernels` policy's (Thrust's, or cuBLAS's
// in a CUDA build) and its element-wise work Thrust transforms, all on the legacy default stream
// (which the staged communicator orders its copies after). Under Thrust's CPP system the same code
// runs on the CPU, which is how CI trains it.
//
// The layers start from the weights stage.hpp draws (seed, layer), so every split of the model,
// on either memory, starts from the same network.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/transform.h>

#include <dtrain/concepts/stage.hpp>
#include <dtrain/core/config.hpp>
#include <dtrain/cuda/thrust_space.hpp>
#include <dtrain/tensor_parallel/device_kernels.hpp>
#include <dtrain/tensor_parallel/linear.hpp>

#include "layers.hpp"
#include "settings.hpp"

namespace fashion_mnist {

namespace device {

namespace space = dtrain::detail::thrust_space;

struct relu {
  DTRAIN_HOST_DEVICE float operator()(float v) const { return v > 0.0f ? v : 0.0f; }
};
struct relu_backward {  // the gradient passes where the layer's output was positive
  DTRAIN_HOST_DEVICE float operator()(float grad, float y) const { return y > 0.0f ? grad : 0.0f; }
};

// Softmax cross-entropy of one row of logits: its loss, whether its top logit is the label, and
// with `dz` its gradient (p - onehot) / rows, in the host stage's arithmetic.
struct softmax_row {
  const float* z;
  const int* labels;
  float* dz;
  double* loss;
  int* hit;
  std::size_t classes, rows;
  DTRAIN_HOST_DEVICE void operator()(std::size_t r) const {
    const float* zr = z + r * classes;
    std::size_t best = 0;
    for (std::size_t c = 1; c < classes; ++c) best = zr[c] > zr[best] ? c : best;
    const float top = zr[best];
    const int label = labels[r];
    double sum = 0;
    for (std::size_t c = 0; c < classes; ++c) sum += exp(double(zr[c] - top));
    loss[r] = log(sum) - double(zr[label] - top);
    hit[r] = static_cast<int>(best) == label ? 1 : 0;
    if (dz == nullptr) return;
    for (std::size_t c = 0; c < classes; ++c) {
      dz[r * classes + c] =
          float((exp(double(zr[c] - top)) / sum - (int(c) == label ? 1.0 : 0.0)) / double(rows));
    }
  }
};

}  // namespace device

/// Layers [first, last) of the MLP `widths` on a device, tensor-parallel over `tp` (a collective
/// of Thrust's device memory), reading samples from `source` (host memory: each micro-batch's
/// images and labels are uploaded).
template <class Collective, class Kernels = dtrain::tensor_parallel::thrust_kernels>
class device_parallel_stage {
 public:
  using value_type = float;
  using span = dtrain::thrust_buffer<float>;
  using const_span = dtrain::thrust_buffer<const float>;
  using buffer = device::space::buffer<float>;
  using column = dtrain::tensor_parallel::column_parallel_linear<float, Collective, Kernels>;
  using row = dtrain::tensor_parallel::row_parallel_linear<float, Collective, Kernels>;

  device_parallel_stage(Collective& tp, std::vector<int> widths, int first, int last, const sample_source& source,
                        std::uint64_t seed)
      : widths_(std::move(widths)), first_(first), last_(last), source_(&source),
        layers_(tp, widths_, first, last, seed) {}

  std::size_t tensor_count() const noexcept { return 2 * static_cast<std::size_t>(last_ - first_); }
  span parameters(std::size_t i) { return layers_.tensor(i, false).span(); }
  span gradients(std::size_t i) { return layers_.tensor(i, true).span(); }
  std::size_t input_size() const noexcept {
    return first_ == 0 ? 0 : source_->micro_batch_size * static_cast<std::size_t>(widths_[first_]);
  }
  std::size_t output_size() const noexcept {
    return last_ == layers() ? 0 : source_->micro_batch_size * static_cast<std::size_t>(widths_[last_]);
  }
  /// Correct predictions of the last stage's forwards since the last `reset_hits`.
  std::size_t hits() const noexcept { return hits_; }
  void reset_hits() noexcept { hits_ = 0; }

  double forward(const dtrain::micro_batch& mb, const_span in, span out) {
    std::vector<buffer> acts;  // each layer's input, then the last output
    acts.push_back(first_ == 0 ? images(mb) : copy_of(in));
    const std::size_t b = source_->micro_batch_size;
    for (int l = first_; l < last_; ++l) {
      buffer y(b * layers_.output_width(l, widths_));
      if (l % 2 == 0) {
        layers_.column_at(l).forward(view(acts.back()), y.span());
      } else {
        layers_.row_at(l).forward(view(acts.back()), y.span());
      }
      if (l + 1 < layers()) thrust::transform(on(), y.data(), y.data() + y.size(), y.data(), device::relu{});
      acts.push_back(std::move(y));
    }
    double loss = 0;
    if (last_ == layers()) {
      loss = softmax_cross_entropy(mb, acts.back(), nullptr);
    } else {
      device::space::copy<float>(out, view(acts.back()), {});
    }
    saved_[mb.index] = std::move(acts);
    return loss;
  }

  void backward(const dtrain::micro_batch& mb, const_span out_grad, span in_grad) {
    std::vector<buffer> acts = std::move(saved_.at(mb.index));
    saved_.erase(mb.index);
    buffer delta(acts.back().size());
    if (last_ == layers()) {
      softmax_cross_entropy(mb, acts.back(), &delta);
    } else {
      device::space::copy<float>(delta.span(), out_grad, {});
    }
    for (int l = last_ - 1; l >= first_; --l) {
      buffer& x = acts[static_cast<std::size_t>(l - first_)];
      buffer& y = acts[static_cast<std::size_t>(l - first_ + 1)];
      if (l + 1 < layers()) {
        thrust::transform(on(), delta.data(), delta.data() + delta.size(), y.data(), delta.data(),
                          device::relu_backward{});
      }
      buffer dx(l > 0 ? x.size() : 0);  // the model's input needs no gradient
      if (l % 2 == 0) {
        layers_.column_at(l).backward(view(x), view(delta), dx.span());
      } else {
        layers_.row_at(l).backward(view(x), view(delta), dx.span());
      }
      delta = std::move(dx);
    }
    if (!in_grad.empty()) device::space::copy<float>(in_grad, view(delta), {});
  }

  void discard(const dtrain::micro_batch& mb) { saved_.erase(mb.index); }

 private:
  static auto on() { return device::space::on({}); }
  static const_span view(buffer& b) { return const_span(b.span()); }
  static buffer copy_of(const_span in) {
    buffer b(in.size());
    device::space::copy<float>(b.span(), in, {});
    return b;
  }

  int layers() const noexcept { return static_cast<int>(widths_.size()) - 1; }

  buffer images(const dtrain::micro_batch& mb) const {
    const std::vector<float> x = images_of(*source_, mb.index);
    buffer b(x.size());
    device::space::upload<float>(b.span(), x, {});
    return b;
  }

  // Mean softmax cross-entropy of the logits `z` against the micro-batch's labels, one thread a
  // row; with `dz`, its gradient. Counts correct predictions (of forward passes).
  double softmax_cross_entropy(const dtrain::micro_batch& mb, buffer& z, buffer* dz) {
    const auto samples = samples_of(*source_, mb.index);
    const std::size_t b = samples.size();
    std::vector<int> labels(b);
    for (std::size_t r = 0; r < b; ++r) labels[r] = source_->data->labels[samples[r]];
    device::space::buffer<int> labels_d(b), hit_d(b);
    device::space::buffer<double> loss_d(b);
    device::space::upload<int>(labels_d.span(), labels, {});
    thrust::for_each(on(), thrust::counting_iterator<std::size_t>(0), thrust::counting_iterator<std::size_t>(b),
                     device::softmax_row{z.data(), labels_d.data(), dz == nullptr ? nullptr : dz->data(),
                                         loss_d.data(), hit_d.data(), static_cast<std::size_t>(classes), b});
    const std::vector<double> loss =
        device::space::to_host<double>(dtrain::thrust_buffer<const double>(loss_d.span()), {});
    const std::vector<int> hit = device::space::to_host<int>(dtrain::thrust_buffer<const int>(hit_d.span()), {});
    double sum = 0;
    for (std::size_t r = 0; r < b; ++r) {
      sum += loss[r];
      hits_ += dz == nullptr ? static_cast<std::size_t>(hit[r]) : 0;
    }
    return sum / static_cast<double>(b);
  }

  std::vector<int> widths_;
  int first_, last_;
  const sample_source* source_;
  stage_layers<column, row> layers_;
  std::map<int, std::vector<buffer>> saved_;
  std::size_t hits_ = 0;
};

}  // namespace fashion_mnist
