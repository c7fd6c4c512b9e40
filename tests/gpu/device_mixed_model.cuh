#pragma once
// A 16-bit model whose tensors live in GPU memory and whose arithmetic is the host's
// mixed_linear_model (../sharded/mixed_models.hpp): each pass copies the device weights into
// the host model, runs it, and copies each gradient to the device before reporting it ready.
// What it tests is the trainer's device path (conversions, reductions and loss scaling on the
// GPU) against the serial mixed simulation, bit for bit where the arithmetic is the host's.

#include <cstddef>
#include <span>
#include <vector>

#include "../sharded/mixed_models.hpp"
#include "dtrain/concepts/model.hpp"
#include "dtrain/cuda/runtime.hpp"

namespace dtrain::testing {

template <class T>
class device_mixed_model {
 public:
  using value_type = T;
  using batch_type = typename mixed_linear_model<T>::batch_type;

  device_mixed_model(const regression_data& data, double init)
      : host(data, init), w_(dim()), g_(dim()) {
    copy_in(w_.span(), whole(host, &mixed_linear_model<T>::parameters));
  }

  std::size_t tensor_count() const noexcept { return host.tensor_count(); }
  device_span<T> parameters(std::size_t i) { return w_.span().subspan(offset(i), tensor_sizes[i]); }
  device_span<T> gradients(std::size_t i) { return g_.span().subspan(offset(i), tensor_sizes[i]); }
  cudaStream_t stream() const noexcept { return stream_.get(); }
  void set_loss_scale(double s) { host.set_loss_scale(s); }

  double forward_backward(const batch_type& batch, gradient_ready ready) {
    stream_.synchronize();
    copy_out(whole(host, &mixed_linear_model<T>::parameters), w_.span());
    auto on_host_ready = [&](std::size_t i) {
      copy_in(gradients(i), host.gradients(i));
      ready(i);
    };
    return host.forward_backward(batch, on_host_ready);
  }

  /// The device weights, widened to double.
  std::vector<double> weights() {
    stream_.synchronize();
    copy_out(whole(host, &mixed_linear_model<T>::parameters), w_.span());
    return host.weights();
  }

  mixed_linear_model<T> host;  // the arithmetic, and its overflow injection

 private:
  static std::size_t offset(std::size_t i) {
    std::size_t at = 0;
    for (std::size_t k = 0; k < i; ++k) at += tensor_sizes[k];
    return at;
  }
  // The model's tensors side by side: mixed_linear_model keeps them so.
  static std::span<T> whole(mixed_linear_model<T>& m, std::span<T> (mixed_linear_model<T>::*of)(std::size_t)) {
    return {(m.*of)(0).data(), dim()};
  }
  void copy_in(device_span<T> to, std::span<const T> from) {
    cuda::copy_async<T>(to, from, stream_.get());
    stream_.synchronize();
  }
  void copy_out(std::span<T> to, device_span<const T> from) {
    cuda::copy_async<const T>(to, from, stream_.get());
    stream_.synchronize();
  }

  cuda::stream stream_;
  cuda::device_buffer<T> w_, g_;
};

}  // namespace dtrain::testing
