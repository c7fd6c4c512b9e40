// Statements given a device unit model (`my_units`, two units whose gathered parameters and
// gradients are Thrust's device memory, its kernels on one stream), this rank's batches and a
// collective of Thrust's device memory (`comm`, of type `comm_t`: the staged communicator over
// TCP); compiled only, under Thrust's CPP system, where device memory is host memory.
// links: dtrain::asio dtrain_test_thrust_cpp
// needs: asio thrust
#include <algorithm>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include <dtrain/collective/staged.hpp>
#include <dtrain/sharded/device_trainer.hpp>
#include <dtrain/transport/tcp.hpp>
#include <dtrain/updater/adam.hpp>

// The reader's model: a layer of 256 weights and its 16 biases, then a second unit alike.
class my_units {
 public:
  using value_type = float;
  using batch_type = std::size_t;
  std::size_t unit_count() const noexcept { return 2; }
  std::vector<std::size_t> unit_tensors(std::size_t) const { return {256, 16}; }
  void initialize(std::size_t, std::size_t, std::span<float> w) { std::fill(w.begin(), w.end(), 0.01f); }
  dtrain::detail::thrust_space::stream_handle stream() const { return stream_.get(); }
  double forward_backward(const batch_type& batch, dtrain::sharded::device_unit_access<float>& units);

 private:
  dtrain::detail::thrust_space::owned_stream stream_;
};
static_assert(dtrain::sharded::device_unit_model<my_units>);

using comm_t = dtrain::staged_communicator<dtrain::tcp_transport>;

void doc_block(comm_t comm, my_units& model, const std::vector<my_units::batch_type>& my_shard) {
// @block@
}
