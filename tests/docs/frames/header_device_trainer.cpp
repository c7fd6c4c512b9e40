// Statements given a device model, this rank's batches and a collective of Thrust's device memory
// (`comm`, of type `comm_t`: the staged communicator over TCP), compiled only, under Thrust's CPP
// system, where device memory is host memory and a stream is the calling thread. The allreduce
// and the sharded device trainers' examples both use it.
// links: dtrain::asio dtrain_test_thrust_cpp
// needs: asio thrust
#include <cstddef>
#include <utility>
#include <vector>

#include <dtrain/allreduce/device_trainer.hpp>
#include <dtrain/sharded/device_trainer.hpp>
#include <dtrain/collective/staged.hpp>
#include <dtrain/transport/tcp.hpp>
#include <dtrain/updater/adam.hpp>
#include <dtrain/updater/momentum.hpp>

// The reader's model: one tensor in Thrust's device memory, its kernels on one stream.
class my_model {
 public:
  using value_type = float;
  using batch_type = std::size_t;
  std::size_t tensor_count() const noexcept { return 1; }
  dtrain::thrust_buffer<float> parameters(std::size_t) { return weights_.span(); }
  dtrain::thrust_buffer<float> gradients(std::size_t) { return grads_.span(); }
  dtrain::detail::thrust_space::stream_handle stream() const { return stream_.get(); }
  double forward_backward(const batch_type& batch, dtrain::gradient_ready ready);

 private:
  dtrain::detail::thrust_space::buffer<float> weights_{1000}, grads_{1000};
  dtrain::detail::thrust_space::owned_stream stream_;
};

using comm_t = dtrain::staged_communicator<dtrain::tcp_transport>;

void doc_block(comm_t comm, my_model& model, const std::vector<my_model::batch_type>& my_shard) {
// @block@
}
