// Built once per Thrust device system (CPP and OMP on the CPU; CUDA in the GPU build).
#include <thrust/version.h>

#include "../catch.hpp"
#include "dtrain/concepts/reduction.hpp"
#include "dtrain/reduce/thrust.hpp"
#include "reduce_reference.hpp"

static_assert(dtrain::reduction<dtrain::thrust_reduction<>>);

TEST_CASE("thrust_reduction: every op and type matches a scalar reference", "[reduce][thrust]") {
  INFO("Thrust " << THRUST_MAJOR_VERSION << "." << THRUST_MINOR_VERSION << ", device system "
                 << THRUST_DEVICE_SYSTEM);
  dtrain::test::check_reduction(dtrain::thrust_reduction<>{});
}
