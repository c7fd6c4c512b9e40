// Statements given the reader's stage type, `my_stage` (built from its pipeline stage and its
// replica), and a step count, over TCP (compiled only).
// links: dtrain::asio
// needs: asio
#include <cstddef>
#include <span>
#include <vector>

#include <dtrain/collective/communicator.hpp>
#include <dtrain/concepts/stage.hpp>
#include <dtrain/pipeline/schedule.hpp>
#include <dtrain/pipeline/trainer.hpp>
#include <dtrain/topology/mesh.hpp>
#include <dtrain/transport/group.hpp>
#include <dtrain/transport/tcp.hpp>
#include <dtrain/updater/adam.hpp>

// Declared, not defined: what a stage is, as tests/archetypes' stage_archetype says.
class my_stage {
 public:
  using value_type = double;
  my_stage(int stage, int replica);
  std::size_t tensor_count() const noexcept;
  std::span<double> parameters(std::size_t i);
  std::span<double> gradients(std::size_t i);
  std::size_t input_size() const noexcept;
  std::size_t output_size() const noexcept;
  double forward(const dtrain::micro_batch& mb, std::span<const double> in, std::span<double> out);
  void backward(const dtrain::micro_batch& mb, std::span<const double> out_grad, std::span<double> in_grad);
  void discard(const dtrain::micro_batch& mb);
};
static_assert(dtrain::stage<my_stage>);

void doc_block(int steps) {
// @block@
}
