#pragma once
// The model-parallel example on device memory: what main_device.cpp (host C++: the command line,
// the data, TCP) calls in device_training.cpp (nvcc in a CUDA build: Thrust, cuBLAS). The
// transport crosses as `any_transport`, since nvcc cannot compile Boost.Asio.

#include <dtrain/transport/any.hpp>

#include "settings.hpp"

namespace fashion_mnist {

/// The exit status with no GPU in a CUDA build: the convention for "skipped" that ctest's
/// SKIP_RETURN_CODE reads.
inline constexpr int exit_no_device = 77;

/// Trains `s` on device memory over `world` (this rank's transport of the job): stages whose
/// tensors and activations are Thrust's device memory (GPU memory in a CUDA build, the GPU of
/// DTRAIN_LOCAL_RANK modulo the host's count), the pipeline's messages and the tp and dp
/// collectives staged through pinned host memory over `world`. Returns the exit status (0; 3
/// below `s.min_accuracy`; `exit_no_device`).
int train_on_device(const settings& s, dtrain::any_transport world, const split& train, const split& test);

}  // namespace fashion_mnist
