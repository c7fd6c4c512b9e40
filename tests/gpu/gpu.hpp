#pragma once
// Shared by the [gpu] tests: they need a CUDA device, and say so when there is none, exiting with
// status 77, which ctest reports as skipped (SKIP_RETURN_CODE). Each ctest test runs one test case,
// so leaving the process skips exactly that case; a failure anywhere still fails by exit status.

#include <cstdio>
#include <cstdlib>

#include "dtrain/cuda/runtime.hpp"

#define DTRAIN_REQUIRE_GPUS(n)                                                                 \
  do {                                                                                         \
    if (dtrain::cuda::device_count() < (n)) {                                                  \
      std::printf("skipped: this test needs %d CUDA device(s); %d visible\n", (n),             \
                  dtrain::cuda::device_count());                                               \
      std::fflush(stdout);                                                                     \
      std::exit(77);                                                                           \
    }                                                                                          \
  } while (false)
