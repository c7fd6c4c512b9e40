// Statements given the tensor-parallel group's collective of Thrust's device memory (`group`, of
// type `comm_t`: the staged communicator over TCP) and three device spans: a batch's input `x`
// (batch x 784), the hidden activations `h` (batch x this rank's hidden features) and the output
// `y` (batch x 10). Compiled only, under Thrust's CPP system, where device memory is host memory.
// links: dtrain::asio dtrain_test_thrust_cpp
// needs: asio thrust
#include <dtrain/collective/staged.hpp>
#include <dtrain/cuda/thrust_space.hpp>
#include <dtrain/tensor_parallel/device_kernels.hpp>
#include <dtrain/tensor_parallel/linear.hpp>
#include <dtrain/transport/tcp.hpp>

using comm_t = dtrain::staged_communicator<dtrain::tcp_transport>;

void doc_block(comm_t& group, dtrain::thrust_buffer<const float> x, dtrain::thrust_buffer<float> h,
               dtrain::thrust_buffer<float> y) {
// @block@
}
