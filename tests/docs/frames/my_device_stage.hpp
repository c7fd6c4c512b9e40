#pragma once
// What the device-pipeline frames leave to their reader: a stage whose tensors and activations are
// Thrust device buffers (std::span under Thrust's CPP system, where the frames compile; device_span
// under CUDA). Declared, not defined.
#include <cstddef>

#include <dtrain/concepts/stage.hpp>
#include <dtrain/cuda/thrust_space.hpp>

class my_device_stage {
 public:
  using value_type = float;
  explicit my_device_stage(int stage, int replica = 0);
  std::size_t tensor_count() const noexcept;
  dtrain::thrust_buffer<float> parameters(std::size_t i);
  dtrain::thrust_buffer<float> gradients(std::size_t i);
  std::size_t input_size() const noexcept;
  std::size_t output_size() const noexcept;
  double forward(const dtrain::micro_batch& mb, dtrain::thrust_buffer<const float> in,
                 dtrain::thrust_buffer<float> out);
  void backward(const dtrain::micro_batch& mb, dtrain::thrust_buffer<const float> out_grad,
                dtrain::thrust_buffer<float> in_grad);
  void discard(const dtrain::micro_batch& mb);
};
static_assert(dtrain::stage<my_device_stage, dtrain::thrust_device_memory>);
