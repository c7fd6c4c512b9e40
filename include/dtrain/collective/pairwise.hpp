#pragma once
/// @file
/// Pairwise-exchange alltoall: p-1 steps; at step s a rank sends its block for rank + s and
/// receives the block of rank - s, so every rank talks to one peer at a time. `alltoall_blocks`
/// runs equal blocks by it or by the linear one, as the communicator chose.

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "dtrain/collective/context.hpp"
#include "dtrain/collective/linear.hpp"

namespace dtrain::detail {

/// Pairwise alltoall: block j of `in` (under `send_offs`) goes to rank j; block i of `out`
/// (under `recv_offs`) comes from rank i.
template <transport Transport, element T>
void pairwise_alltoall(call_context<Transport>& ctx, std::span<const T> in, std::span<T> out,
                       const std::vector<std::size_t>& send_offs, const std::vector<std::size_t>& recv_offs) {
  const int p = ctx.size();
  const int r = ctx.rank();
  auto own = block_of(in, send_offs, r);
  std::copy(own.begin(), own.end(), block_of(out, recv_offs, r).begin());
  for (int s = 1; s < p; ++s) {
    const int to = mod(r + s, p);
    const int from = mod(r - s, p);
    ctx.exchange(to, block_of(in, send_offs, to), from, block_of(out, recv_offs, from));
  }
}

/// Alltoall of equal blocks (`in.size() / size` elements each) by `a`: linear (every send posted
/// at once) or pairwise (one exchange per step).
template <transport Transport, element T>
void alltoall_blocks(call_context<Transport>& ctx, algorithm a, std::span<const T> in, std::span<T> out) {
  const auto offs = uniform_offsets(in.size() / static_cast<std::size_t>(ctx.size()), ctx.size());
  if (a == algorithm::linear) {
    linear_alltoall(ctx, in, out, offs, offs);
  } else {
    pairwise_alltoall(ctx, in, out, offs, offs);
  }
}

}  // namespace dtrain::detail
