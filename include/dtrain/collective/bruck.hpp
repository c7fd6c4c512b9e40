#pragma once
/// @file
/// Bruck's allgather: ceil(log2 p) steps for any p. At step k a rank sends the first
/// min(2^k, p - 2^k) blocks it holds to rank - 2^k and receives as many from rank + 2^k; a final
/// local rotation puts the blocks in rank order. See docs/algorithms.md.

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "dtrain/collective/context.hpp"
#include "dtrain/detail/scratch_buffer.hpp"

namespace dtrain::detail {

/// Bruck allgather: `out` (p blocks of `in.size()`) gets every rank's `in` in rank order.
/// `in` may alias block `rank` of `out`. `tmp` is working room, resized to p blocks.
template <transport Transport, element T>
void bruck_allgather(call_context<Transport>& ctx, std::span<const T> in, std::span<T> out,
                     scratch_buffer<T>& tmp) {
  const int p = ctx.size();
  const int r = ctx.rank();
  const std::size_t n = in.size();
  // Blocks in the order rank, rank+1, ..., rank-1.
  tmp.resize(static_cast<std::size_t>(p) * n);
  std::copy(in.begin(), in.end(), tmp.begin());
  std::span<T> held(tmp.data(), static_cast<std::size_t>(p) * n);
  for (int dist = 1; dist < p; dist *= 2) {
    const std::size_t blocks = static_cast<std::size_t>(std::min(dist, p - dist));
    ctx.exchange(mod(r - dist, p), std::span<const T>(held.subspan(0, blocks * n)), mod(r + dist, p),
                 held.subspan(static_cast<std::size_t>(dist) * n, blocks * n));
  }
  for (int i = 0; i < p; ++i) {
    auto src = held.subspan(static_cast<std::size_t>(i) * n, n);
    std::copy(src.begin(), src.end(), out.begin() + static_cast<std::ptrdiff_t>(mod(r + i, p) * n));
  }
}

}  // namespace dtrain::detail
