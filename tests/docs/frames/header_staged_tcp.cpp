// Statements given n floats of Thrust's device memory at `grads` (compiled only, under Thrust's
// CPP system: device memory is host memory there).
// links: dtrain::asio dtrain_test_thrust_cpp
// needs: asio thrust
#include <cstddef>

#include <dtrain/collective/staged.hpp>
#include <dtrain/transport/tcp.hpp>

void doc_block(float* grads, std::size_t n) {
// @block@
}
