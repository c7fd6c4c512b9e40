#pragma once
/// @file
/// Dissemination barrier (Hensgen, Finkel and Manber): ceil(log2 p) rounds; in round k a rank
/// signals rank + 2^k and waits for rank - 2^k. After the last round every rank has heard,
/// directly or transitively, from every other.

#include <cstddef>
#include <span>

#include "dtrain/collective/context.hpp"

namespace dtrain::detail {

template <transport Transport>
void dissemination_barrier(call_context<Transport>& ctx) {
  const int p = ctx.size();
  const int r = ctx.rank();
  for (int dist = 1; dist < p; dist *= 2) {
    ctx.exchange(mod(r + dist, p), std::span<const std::int32_t>{}, mod(r - dist, p),
                 std::span<std::int32_t>{});
  }
}

}  // namespace dtrain::detail
