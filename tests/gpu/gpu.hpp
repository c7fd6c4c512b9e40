#pragma once
// Shared by the [gpu] tests: they need a CUDA device, and say so (ctest then reports them as
// skipped, through SKIP_REGULAR_EXPRESSION) when there is none.

#include <cstdio>

#include "dtrain/cuda/runtime.hpp"

#define DTRAIN_REQUIRE_GPUS(n)                                                                 \
  do {                                                                                         \
    if (dtrain::cuda::device_count() < (n)) {                                                  \
      std::printf("dtrain-gpu-skip: this test needs %d CUDA device(s); %d visible\n", (n),    \
                  dtrain::cuda::device_count());                                               \
      return;                                                                                  \
    }                                                                                          \
  } while (false)
