#pragma once
/// @file
/// Pairwise-exchange alltoall: p-1 steps; at step s a rank sends its block for rank + s and
/// receives the block of rank - s, so every rank talks to one peer at a time.

#include <algorithm>
#include <cstddef>
#include <span>

#include "dtrain/collective/context.hpp"

namespace dtrain::detail {

/// Pairwise alltoall: block j of `in` goes to rank j; block i of `out` comes from rank i.
template <transport Transport, element T>
void pairwise_alltoall(call_context<Transport>& ctx, std::span<const T> in, std::span<T> out) {
  const int p = ctx.size();
  const int r = ctx.rank();
  const std::size_t n = in.size() / static_cast<std::size_t>(p);
  auto block = [n](auto s, int i) { return s.subspan(static_cast<std::size_t>(i) * n, n); };
  auto own = block(in, r);
  std::copy(own.begin(), own.end(), block(out, r).begin());
  for (int s = 1; s < p; ++s) {
    const int to = mod(r + s, p);
    const int from = mod(r - s, p);
    ctx.exchange(to, block(in, to), from, block(out, from));
  }
}

}  // namespace dtrain::detail
