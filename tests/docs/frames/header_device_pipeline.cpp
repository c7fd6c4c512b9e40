// Statements given the reader's device stage type, `my_device_stage` (built from its pipeline
// stage), over TCP, compiled under Thrust's CPP system (thrust_buffer is std::span there; under
// CUDA it is device_span).
// links: dtrain::asio dtrain_test_thrust_cpp
// needs: asio thrust
#include <cstddef>
#include <span>
#include <vector>

#include <dtrain/collective/staged.hpp>
#include <dtrain/concepts/stage.hpp>
#include <dtrain/pipeline/device_link.hpp>
#include <dtrain/transport/tcp.hpp>

// Declared, not defined: a stage whose tensors and activations are Thrust device buffers.
class my_device_stage {
 public:
  using value_type = float;
  explicit my_device_stage(int stage);
  std::size_t tensor_count() const noexcept;
  dtrain::thrust_buffer<float> parameters(std::size_t i);
  dtrain::thrust_buffer<float> gradients(std::size_t i);
  std::size_t input_size() const noexcept;
  std::size_t output_size() const noexcept;
  double forward(const dtrain::micro_batch& mb, dtrain::thrust_buffer<const float> in, dtrain::thrust_buffer<float> out);
  void backward(const dtrain::micro_batch& mb, dtrain::thrust_buffer<const float> out_grad,
                dtrain::thrust_buffer<float> in_grad);
  void discard(const dtrain::micro_batch& mb);
};
static_assert(dtrain::stage<my_device_stage, dtrain::thrust_device_memory>);

void doc_block() {
// @block@
}
