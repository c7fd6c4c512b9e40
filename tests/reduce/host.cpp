#include <cstdint>
#include <random>
#include <vector>

#include "../catch.hpp"
#include "dtrain/reduce/host.hpp"
#include "reduce_reference.hpp"

TEST_CASE("host_reduction: every op and type matches a scalar reference", "[reduce][host]") {
#if defined(__F16C__)
  if (!__builtin_cpu_supports("f16c")) {
    WARN("skipped: this build uses F16C instructions and this CPU has none");
    return;
  }
#endif
  dtrain::test::check_reduction(dtrain::host_reduction{});
}
