#pragma once
/// @file
/// Recursive halving-doubling (Rabenseifner) reduce-scatter and allreduce, and recursive-doubling
/// allreduce, with the non-power-of-two fold of Thakur, Rabenseifner and Gropp (2005):
/// with p' the largest power of two <= p and q = p - p', the first 2q ranks pair up; each even
/// rank hands its vector to its odd neighbour, sits out, and gets the result back at the end.
/// Steps: 2 log2 p' (+2 when p is not a power of two). See docs/algorithms.md.

#include <cstddef>
#include <span>
#include <vector>

#include "dtrain/collective/context.hpp"
#include "dtrain/concepts/reduction.hpp"
#include "dtrain/detail/scratch_buffer.hpp"

namespace dtrain::detail {

/// The power-of-two core of a group: p' ranks take part, the first `folded` pairs fold.
struct fold_shape {
  int core;    // p', the largest power of two <= p
  int folded;  // q = p - p'

  explicit fold_shape(int p) : core(1), folded(0) {
    while (core * 2 <= p) core *= 2;
    folded = p - core;
  }
  /// Rank in the core, or -1 for the even ranks that sit out.
  int core_rank(int r) const {
    if (r < 2 * folded) return r % 2 == 1 ? r / 2 : -1;
    return r - folded;
  }
  /// The real rank of core rank `c`.
  int real_rank(int c) const { return c < folded ? 2 * c + 1 : c + folded; }
  /// The first real block owned by core rank `c` (odd core ranks also own their partner's).
  int first_block(int c) const { return c < folded ? 2 * c : c + folded; }
};

/// Step 1 of the fold: even ranks below 2q send `data` to r+1, which reduces it in.
template <transport Transport, element T, class Reduction>
void fold_in(call_context<Transport>& ctx, const fold_shape& f, std::span<T> data, reduce_op op,
             const Reduction& reduce, scratch_buffer<T>& scratch) {
  const int r = ctx.rank();
  if (r >= 2 * f.folded) return;
  if (r % 2 == 0) {
    auto s = ctx.send(r + 1, std::span<const T>(data));
    ctx.wait(s);
  } else {
    scratch.resize(data.size());
    std::span<T> got(scratch.data(), data.size());
    auto rq = ctx.recv(r - 1, got);
    ctx.wait(rq);
    reduce(data, std::span<const T>(got), op);
  }
}

/// Recursive halving among the core: afterwards core rank c holds the reduction of elements
/// [core_offs[c], core_offs[c+1]) of `data`.
template <transport Transport, element T, class Reduction>
void halving_reduce_scatter(call_context<Transport>& ctx, const fold_shape& f, int me,
                            std::span<T> data, const std::vector<std::size_t>& core_offs,
                            reduce_op op, const Reduction& reduce, scratch_buffer<T>& scratch) {
  int lo = 0;  // the core ranks whose elements this rank still holds: [lo, lo + 2 * mask)
  for (int mask = f.core / 2; mask > 0; mask /= 2) {
    const int partner = f.real_rank(me ^ mask);
    const bool upper = (me & mask) != 0;
    const int keep_lo = upper ? lo + mask : lo;
    const int give_lo = upper ? lo : lo + mask;
    auto span_of = [&](int first) {
      std::size_t a = core_offs[static_cast<std::size_t>(first)];
      std::size_t b = core_offs[static_cast<std::size_t>(first + mask)];
      return std::pair{a, b - a};
    };
    auto [keep_at, keep_n] = span_of(keep_lo);
    auto [give_at, give_n] = span_of(give_lo);
    scratch.resize(std::max(scratch.size(), keep_n));
    std::span<T> got(scratch.data(), keep_n);
    ctx.exchange(partner, std::span<const T>(data.subspan(give_at, give_n)), partner, got);
    reduce(data.subspan(keep_at, keep_n), std::span<const T>(got), op);
    lo = keep_lo;
  }
}

/// Recursive doubling among the core: the inverse of `halving_reduce_scatter`; afterwards every
/// core rank holds all of `data`.
template <transport Transport, element T>
void doubling_allgather(call_context<Transport>& ctx, const fold_shape& f, int me,
                        std::span<T> data, const std::vector<std::size_t>& core_offs) {
  for (int mask = 1; mask < f.core; mask *= 2) {
    const int partner = f.real_rank(me ^ mask);
    const int mine = me & ~(mask - 1);
    const int theirs = mine ^ mask;
    auto part = [&](int first) {
      std::size_t a = core_offs[static_cast<std::size_t>(first)];
      std::size_t b = core_offs[static_cast<std::size_t>(first + mask)];
      return data.subspan(a, b - a);
    };
    ctx.exchange(partner, std::span<const T>(part(mine)), partner, part(theirs));
  }
}

/// Step 3 of the fold: odd ranks below 2q send `part` of the result back to r-1.
template <transport Transport, element T>
void fold_out(call_context<Transport>& ctx, const fold_shape& f, std::span<T> part) {
  const int r = ctx.rank();
  if (r >= 2 * f.folded) return;
  if (r % 2 == 1) {
    auto s = ctx.send(r - 1, std::span<const T>(part));
    ctx.wait(s);
  } else {
    auto rq = ctx.recv(r + 1, part);
    ctx.wait(rq);
  }
}

/// An allreduce over the power-of-two core: the fold hands the folded ranks' data in, `core_body`
/// runs on the core ranks with (shape, core rank), and the fold hands the result back out.
template <transport Transport, element T, class Reduction, class CoreBody>
void folded_allreduce(call_context<Transport>& ctx, std::span<T> data, reduce_op op,
                      const Reduction& reduce, scratch_buffer<T>& scratch, CoreBody core_body) {
  if (ctx.size() == 1) return;
  fold_shape f(ctx.size());
  fold_in(ctx, f, data, op, reduce, scratch);
  if (const int me = f.core_rank(ctx.rank()); me >= 0) core_body(f, me);
  fold_out(ctx, f, data);
}

/// Rabenseifner allreduce in place.
template <transport Transport, element T, class Reduction>
void halving_doubling_allreduce(call_context<Transport>& ctx, std::span<T> data, reduce_op op,
                                const Reduction& reduce, scratch_buffer<T>& scratch) {
  folded_allreduce(ctx, data, op, reduce, scratch, [&](const fold_shape& f, int me) {
    auto core_offs = balanced_offsets(data.size(), f.core);
    halving_reduce_scatter(ctx, f, me, data, core_offs, op, reduce, scratch);
    if (op == reduce_op::avg) {
      auto c = static_cast<std::size_t>(me);
      reduce.finish_average(data.subspan(core_offs[c], core_offs[c + 1] - core_offs[c]), ctx.size());
    }
    doubling_allgather(ctx, f, me, data, core_offs);
  });
}

/// Halving reduce-scatter in place over `p` blocks of `block` elements: afterwards block `rank`
/// holds its reduction (`avg` divided).
template <transport Transport, element T, class Reduction>
void halving_doubling_reduce_scatter(call_context<Transport>& ctx, std::span<T> data,
                                     std::size_t block, reduce_op op, const Reduction& reduce,
                                     scratch_buffer<T>& scratch) {
  const int p = ctx.size();
  const int r = ctx.rank();
  std::span<T> mine = data.subspan(static_cast<std::size_t>(r) * block, block);
  if (p > 1) {
    fold_shape f(p);
    fold_in(ctx, f, data, op, reduce, scratch);
    const int me = f.core_rank(r);
    if (me >= 0) {
      // Core rank c must end up with the blocks of the real ranks it stands for.
      std::vector<std::size_t> core_offs(static_cast<std::size_t>(f.core) + 1);
      for (int c = 0; c <= f.core; ++c) {
        int first = c == f.core ? p : f.first_block(c);
        core_offs[static_cast<std::size_t>(c)] = static_cast<std::size_t>(first) * block;
      }
      halving_reduce_scatter(ctx, f, me, data, core_offs, op, reduce, scratch);
    }
    // An odd rank of a folded pair holds its even partner's block too and hands it back.
    bool hands_back = r < 2 * f.folded && r % 2 == 1;
    fold_out(ctx, f, hands_back ? data.subspan(static_cast<std::size_t>(r - 1) * block, block) : mine);
  }
  if (op == reduce_op::avg) reduce.finish_average(mine, p);
}

/// Recursive-doubling allreduce in place: log2 p' exchanges of the whole vector; for small
/// messages, where latency dominates.
template <transport Transport, element T, class Reduction>
void recursive_doubling_allreduce(call_context<Transport>& ctx, std::span<T> data, reduce_op op,
                                  const Reduction& reduce, scratch_buffer<T>& scratch) {
  folded_allreduce(ctx, data, op, reduce, scratch, [&](const fold_shape& f, int me) {
    scratch.resize(std::max(scratch.size(), data.size()));
    std::span<T> got(scratch.data(), data.size());
    for (int mask = 1; mask < f.core; mask *= 2) {
      const int partner = f.real_rank(me ^ mask);
      ctx.exchange(partner, std::span<const T>(data), partner, got);
      reduce(data, std::span<const T>(got), op);
    }
    if (op == reduce_op::avg) reduce.finish_average(data, ctx.size());
  });
}

}  // namespace dtrain::detail
