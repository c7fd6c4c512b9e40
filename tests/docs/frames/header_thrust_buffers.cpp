// Statements given n parameters and their gradients in Thrust's device memory and the stream to
// run on (compiled only, under Thrust's CPP system: host memory and the calling thread).
// links: dtrain_test_thrust_cpp
// needs: thrust
#include <cstddef>

#include <dtrain/cuda/thrust_space.hpp>
#include <dtrain/updater/adam.hpp>
#include <dtrain/updater/device.hpp>

void doc_block(dtrain::thrust_buffer<float> params, dtrain::thrust_buffer<const float> grads, std::size_t n,
               dtrain::detail::thrust_space::stream_handle stream) {
// @block@
}
