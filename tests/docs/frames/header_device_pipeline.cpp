// Statements given the reader's device stage type, `my_device_stage` (built from its pipeline
// stage), over TCP, compiled under Thrust's CPP system (thrust_buffer is std::span there; under
// CUDA it is device_span).
// links: dtrain::asio dtrain_test_thrust_cpp
// needs: asio thrust
#include <cstddef>
#include <span>
#include <vector>

#include <dtrain/collective/staged.hpp>
#include <dtrain/pipeline/device_link.hpp>
#include <dtrain/transport/tcp.hpp>

#include "tests/docs/frames/my_device_stage.hpp"

void doc_block() {
// @block@
}
