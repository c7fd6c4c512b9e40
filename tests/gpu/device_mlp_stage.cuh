#pragma once
// A pipeline stage whose parameters, gradients and activations live in GPU memory and whose
// arithmetic is the host's mlp_stage (../pipeline/mlp_stage.hpp): each pass copies the device
// weights and the incoming activation into the host stage, runs it, and copies its output (and,
// after backward, its gradients) back to the device. What it tests is the executor's device path
// (activations in device buffers, staged messages, weight stashing by device copies) against the
// serial reference, bit for bit since the arithmetic is the host's.

#include <cstddef>
#include <span>
#include <vector>

#include "../pipeline/mlp_stage.hpp"
#include "dtrain/concepts/stage.hpp"
#include "dtrain/cuda/runtime.hpp"

namespace dtrain::testing {

class device_mlp_stage {
 public:
  using value_type = double;

  device_mlp_stage(std::vector<int> widths, int first, int last, int batch, int replica = 0, int replicas = 1)
      : host_(std::move(widths), first, last, batch, replica, replicas) {
    for (std::size_t i = 0; i < host_.tensor_count(); ++i) {
      w_.emplace_back(host_.parameters(i).size());
      g_.emplace_back(host_.gradients(i).size());
      upload(w_[i].span(), host_.parameters(i));
      upload(g_[i].span(), host_.gradients(i));
    }
  }

  std::size_t tensor_count() const noexcept { return host_.tensor_count(); }
  device_span<double> parameters(std::size_t i) { return w_[i].span(); }
  device_span<double> gradients(std::size_t i) { return g_[i].span(); }
  std::size_t input_size() const noexcept { return host_.input_size(); }
  std::size_t output_size() const noexcept { return host_.output_size(); }

  double forward(const micro_batch& mb, device_span<const double> in, device_span<double> out) {
    weights_to_host();
    std::vector<double> x(in.size()), y(out.size());
    download(std::span(x), in);
    const double loss = host_.forward(mb, x, y);
    upload(out, y);
    return loss;
  }
  void backward(const micro_batch& mb, device_span<const double> out_grad, device_span<double> in_grad) {
    weights_to_host();
    for (std::size_t i = 0; i < tensor_count(); ++i)
      download(host_.gradients(i), device_span<const double>(g_[i].span()));
    std::vector<double> dy(out_grad.size()), dx(in_grad.size());
    download(std::span(dy), out_grad);
    host_.backward(mb, dy, dx);
    upload(in_grad, dx);
    for (std::size_t i = 0; i < tensor_count(); ++i) upload(g_[i].span(), host_.gradients(i));
  }
  void discard(const micro_batch& mb) { host_.discard(mb); }

 private:
  // The legacy default stream: the executor's copies and the staged messages are ordered with it.
  static void upload(device_span<double> to, std::span<const double> from) {
    cuda::check(cudaMemcpy(to.data(), from.data(), from.size_bytes(), cudaMemcpyHostToDevice), "H2D");
  }
  static void download(std::span<double> to, device_span<const double> from) {
    cuda::check(cudaMemcpy(to.data(), from.data(), from.size_bytes(), cudaMemcpyDeviceToHost), "D2H");
  }
  void weights_to_host() {
    for (std::size_t i = 0; i < tensor_count(); ++i)
      download(host_.parameters(i), device_span<const double>(w_[i].span()));
  }

  mlp_stage<double> host_;
  std::vector<cuda::device_buffer<double>> w_, g_;
};

static_assert(stage<device_mlp_stage, device_memory>);

}  // namespace dtrain::testing
