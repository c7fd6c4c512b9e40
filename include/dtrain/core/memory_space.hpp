#pragma once
/// @file
/// Memory spaces as types, so that a buffer's location is known at compile time.

namespace dtrain {

/// Ordinary host memory: every transport and the host reductions can read it.
struct host_memory {};

/// GPU device memory: only device-aware models (NCCL, Thrust on CUDA) accept it.
struct device_memory {};

}  // namespace dtrain
