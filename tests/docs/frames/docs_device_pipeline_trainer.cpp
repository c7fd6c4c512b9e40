// Statements given the reader's device stage type, `my_device_stage` (built from its pipeline
// stage and its replica), and a step count, over TCP, compiled under Thrust's CPP system
// (thrust_buffer is std::span there; under CUDA it is device_span).
// links: dtrain::asio dtrain_test_thrust_cpp
// needs: asio thrust
#include <dtrain/collective/staged.hpp>
#include <dtrain/pipeline/device_link.hpp>
#include <dtrain/pipeline/schedule.hpp>
#include <dtrain/pipeline/trainer.hpp>
#include <dtrain/topology/mesh.hpp>
#include <dtrain/transport/group.hpp>
#include <dtrain/transport/tcp.hpp>

#include "tests/docs/frames/my_device_stage.hpp"
#include <dtrain/updater/adam.hpp>
#include <dtrain/updater/device.hpp>

void doc_block(int steps) {
// @block@
}
