// Statements given a staged communicator over TCP, two neighbouring ranks and two buffers of
// Thrust's device memory (compiled only, under Thrust's CPP system: device memory is host memory
// there).
// links: dtrain::asio dtrain_test_thrust_cpp
// needs: asio thrust
#include <chrono>

#include <dtrain/collective/staged.hpp>
#include <dtrain/transport/tcp.hpp>

void doc_block(dtrain::staged_communicator<dtrain::tcp_transport>& comm, int next, int prev,
               dtrain::thrust_buffer<const float> activation, dtrain::thrust_buffer<float> incoming) {
// @block@
}
