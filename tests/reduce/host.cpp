#include <cstdint>
#include <random>
#include <vector>

#include "../catch.hpp"
#include "dtrain/reduce/host.hpp"
#include "reduce_reference.hpp"

TEST_CASE("host_reduction: every op and type matches a scalar reference", "[reduce][host]") {
  dtrain::test::check_reduction(dtrain::host_reduction{});
}
