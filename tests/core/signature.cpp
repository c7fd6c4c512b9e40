#include <string>

#include "../catch.hpp"
#include "dtrain/core/signature.hpp"

TEST_CASE("signatures describe themselves for error messages", "[core][signature]") {
  using namespace dtrain;
  signature s{coll_op::allreduce, algorithm::ring, dtype::float32, reduce_op::sum, 0, 1000, 7};
  CHECK(describe(s) == "allreduce #7 (ring, float32 sum, count 1000)");
  signature b{coll_op::broadcast, algorithm::binomial_tree, dtype::int64, reduce_op::sum, 2, 5, 3};
  CHECK(describe(b) == "broadcast #3 (binomial_tree, int64, count 5, root 2)");
  signature bar{coll_op::barrier, algorithm::dissemination, dtype::int32, reduce_op::sum, 0, 0, 9};
  CHECK(describe(bar) == "barrier #9 (dissemination)");
  CHECK_FALSE(s == b);
  signature s2 = s;
  s2.seq = 8;
  CHECK_FALSE(s == s2);
}
