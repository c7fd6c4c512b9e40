#pragma once
/// @file
/// Ring algorithms: reduce-scatter, allgather and allreduce (reduce-scatter + allgather).
///
/// Each block travels around the ring in segments; a rank forwards segment k of a block as soon
/// as it has received (and reduced) it, so consecutive steps overlap. Steps: 2(p-1);
/// bytes sent per rank: 2(p-1)/p * n for allreduce. See docs/algorithms.md.

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "dtrain/collective/context.hpp"
#include "dtrain/concepts/reduction.hpp"
#include "dtrain/detail/scratch_buffer.hpp"

namespace dtrain::detail {

/// Segment layout of a set of blocks: every block is cut into the same number of segments.
struct segmentation {
  const std::vector<std::size_t>& offs;
  std::size_t seg;    // elements per segment
  std::size_t count;  // segments per block

  segmentation(const std::vector<std::size_t>& o, std::size_t seg_elems) : offs(o), seg(seg_elems) {
    std::size_t largest = 0;
    for (std::size_t b = 0; b + 1 < offs.size(); ++b) largest = std::max(largest, offs[b + 1] - offs[b]);
    count = std::max<std::size_t>(1, (largest + seg - 1) / seg);
  }

  /// [begin, end) of segment k of block b; empty when the block is shorter.
  std::pair<std::size_t, std::size_t> range(int b, std::size_t k) const {
    std::size_t lo = offs[static_cast<std::size_t>(b)];
    std::size_t hi = offs[static_cast<std::size_t>(b) + 1];
    return {std::min(hi, lo + k * seg), std::min(hi, lo + (k + 1) * seg)};
  }

  template <class T>
  std::span<T> of(std::span<T> data, int b, std::size_t k) const {
    auto [lo, hi] = range(b, k);
    return data.subspan(lo, hi - lo);
  }
};

/// Ring reduce-scatter in place: afterwards block `rank` of `data` (blocks given by `offs`, one
/// per rank) holds the reduction over all ranks (`avg` not yet divided). `scratch` must hold two
/// of the largest block.
template <transport Transport, element T, class Reduction>
void ring_reduce_scatter(call_context<Transport>& ctx, std::span<T> data,
                         const std::vector<std::size_t>& offs, reduce_op op,
                         const Reduction& reduce, scratch_buffer<T>& scratch) {
  const int p = ctx.size();
  const int r = ctx.rank();
  if (p == 1) return;
  const int left = mod(r - 1, p);
  const int right = mod(r + 1, p);
  segmentation segs(offs, ctx.template segment_elements<T>());
  const std::size_t half = segs.count * segs.seg;
  scratch.resize(2 * std::min(half, data.size() + 1));
  const std::size_t slot = scratch.size() / 2;  // one block's room per step parity

  using pending = typename call_context<Transport>::pending;
  std::vector<std::vector<pending>> recvs(2);
  auto post_recvs = [&](int step) {
    int b = mod(r - step - 2, p);
    auto& rs = recvs[static_cast<std::size_t>(step % 2)];
    std::span<T> room(scratch.data() + (step % 2) * slot, slot);
    for (std::size_t k = 0; k < segs.count; ++k) {
      auto [lo, hi] = segs.range(b, k);
      rs.push_back(ctx.recv(left, room.subspan(lo - offs[static_cast<std::size_t>(b)], hi - lo)));
    }
  };

  std::vector<pending> sends, next_sends;
  post_recvs(0);
  for (std::size_t k = 0; k < segs.count; ++k) {
    sends.push_back(ctx.send(right, segs.of(data, mod(r - 1, p), k)));
  }
  for (int s = 0; s < p - 1; ++s) {
    const bool more = s + 1 < p - 1;
    if (more) post_recvs(s + 1);
    const int b = mod(r - s - 2, p);
    auto& rs = recvs[static_cast<std::size_t>(s % 2)];
    for (std::size_t k = 0; k < segs.count; ++k) {
      ctx.wait(rs[k]);
      auto dst = segs.of(data, b, k);
      auto [lo, hi] = segs.range(b, k);
      std::span<const T> got(scratch.data() + (s % 2) * slot + (lo - offs[static_cast<std::size_t>(b)]),
                             hi - lo);
      reduce(dst, got, op);
      if (more) next_sends.push_back(ctx.send(right, dst));
    }
    rs.clear();
    ctx.wait_all(sends);
    std::swap(sends, next_sends);
  }
  ctx.wait_all(sends);
}

/// Ring allgather in place: block `rank` of `data` is this rank's; afterwards every block holds
/// its owner's contribution.
template <transport Transport, element T>
void ring_allgather(call_context<Transport>& ctx, std::span<T> data,
                    const std::vector<std::size_t>& offs) {
  const int p = ctx.size();
  const int r = ctx.rank();
  if (p == 1) return;
  const int left = mod(r - 1, p);
  const int right = mod(r + 1, p);
  segmentation segs(offs, ctx.template segment_elements<T>());

  using pending = typename call_context<Transport>::pending;
  // Every step receives a different block, so all receives can be posted up front.
  std::vector<pending> recvs;
  recvs.reserve(static_cast<std::size_t>(p - 1) * segs.count);
  for (int s = 0; s < p - 1; ++s) {
    for (std::size_t k = 0; k < segs.count; ++k) {
      recvs.push_back(ctx.recv(left, segs.of(data, mod(r - s - 1, p), k)));
    }
  }
  std::vector<pending> sends;
  for (std::size_t k = 0; k < segs.count; ++k) sends.push_back(ctx.send(right, segs.of(data, r, k)));
  for (int s = 0; s < p - 1; ++s) {
    for (std::size_t k = 0; k < segs.count; ++k) {
      ctx.wait(recvs[static_cast<std::size_t>(s) * segs.count + k]);
      if (s + 1 < p - 1) sends.push_back(ctx.send(right, segs.of(data, mod(r - s - 1, p), k)));
    }
  }
  ctx.wait_all(sends);
}

/// Ring allreduce in place: reduce-scatter, average the owned block, allgather.
template <transport Transport, element T, class Reduction>
void ring_allreduce(call_context<Transport>& ctx, std::span<T> data, reduce_op op,
                    const Reduction& reduce, scratch_buffer<T>& scratch) {
  const int p = ctx.size();
  auto offs = balanced_offsets(data.size(), p);
  ring_reduce_scatter(ctx, data, offs, op, reduce, scratch);
  if (op == reduce_op::avg) {
    auto r = static_cast<std::size_t>(ctx.rank());
    reduce.finish_average(data.subspan(offs[r], offs[r + 1] - offs[r]), p);
  }
  ring_allgather(ctx, data, offs);
}

}  // namespace dtrain::detail
