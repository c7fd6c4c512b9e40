#pragma once
/// @file
/// Recursive halving-doubling (Rabenseifner) reduce-scatter and allreduce, and recursive-doubling
/// allreduce, with the non-power-of-two fold of Thakur, Rabenseifner and Gropp (2005):
/// with p' the largest power of two <= p and q = p - p', the first 2q ranks pair up; each even
/// rank hands its vector to its odd neighbour, sits out, and gets the result back at the end.
/// Steps: 2 log2 p' (+2 when p is not a power of two). See docs/algorithms.md.

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "dtrain/collective/context.hpp"
#include "dtrain/concepts/reduction.hpp"
#include "dtrain/concepts/transport.hpp"
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

inline constexpr std::size_t reduce_slots = 4;  // pieces received ahead of the reduction

/// Sends `give` to `partner` and reduces what it sends back into `keep`. Past one piece
/// (`reduce_piece_bytes_of<Transport>`) each way, both go as pieces (both sides cut the same
/// way, so each knows the other's from its own lengths), and each piece received is reduced as
/// soon as it lands, out of one of a few piece-sized slots of `scratch` that stay in the cache.
/// One receive of the whole would write it to memory and read it back; pieces also let the
/// reduction of one overlap the arrival of the next.
template <transport Transport, element T, class Reduction>
void exchange_reduce(call_context<Transport>& ctx, int partner, std::span<const T> give, std::span<T> keep,
                     reduce_op op, const Reduction& reduce, scratch_buffer<T>& scratch) {
  const std::size_t piece = std::max<std::size_t>(1, reduce_piece_bytes_of<Transport> / sizeof(T));
  const std::size_t n_in = (keep.size() + piece - 1) / piece, n_out = (give.size() + piece - 1) / piece;
  if (n_in <= 1 && n_out <= 1) {
    scratch.resize(std::max(scratch.size(), keep.size()));
    std::span<T> got(scratch.data(), keep.size());
    ctx.exchange(partner, give, partner, got);
    reduce(keep, std::span<const T>(got), op);
    return;
  }
  const std::size_t slots = std::min(reduce_slots, std::max<std::size_t>(n_in, 1));
  scratch.resize(std::max(scratch.size(), slots * piece));
  auto slice = [&](auto whole, std::size_t i) {
    return whole.subspan(i * piece, std::min(piece, whole.size() - i * piece));
  };
  auto slot = [&](std::size_t i) { return std::span<T>(scratch.data() + (i % slots) * piece, slice(keep, i).size()); };
  using pending = typename call_context<Transport>::pending;
  std::vector<pending> recvs, sends;
  recvs.reserve(n_in);
  sends.reserve(n_out);
  auto post = [&](std::size_t upto) {  // receives and sends up to piece `upto`, exclusive
    while (recvs.size() < std::min(upto, n_in)) recvs.push_back(ctx.recv(partner, slot(recvs.size())));
    while (sends.size() < std::min(upto, n_out)) sends.push_back(ctx.send(partner, slice(give, sends.size())));
  };
  const bool in_place = give.data() == keep.data();  // recursive doubling sends what it reduces into
  std::size_t sent = 0;                               // sends waited for
  post(slots);
  for (std::size_t i = 0; i < n_in; ++i) {
    ctx.wait(recvs[i]);
    while (in_place && sent <= i) ctx.wait(sends[sent++]);  // its bytes are gone before they change
    reduce(slice(keep, i), std::span<const T>(slot(i)), op);
    post(i + 1 + slots);  // the slot is free again
  }
  post(n_out);
  while (sent < sends.size()) ctx.wait(sends[sent++]);
}

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
/// With `source` (out of place, no fold) the first step sends from it and copies in only the
/// half it keeps: the rest of `data` is written by whatever follows.
template <transport Transport, element T, class Reduction>
void halving_reduce_scatter(call_context<Transport>& ctx, const fold_shape& f, int me,
                            std::span<T> data, const std::vector<std::size_t>& core_offs,
                            reduce_op op, const Reduction& reduce, scratch_buffer<T>& scratch,
                            std::span<const T> source = {}) {
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
    std::span<const T> from = data;
    if (mask == f.core / 2 && !source.empty()) {
      from = source;
      std::copy_n(source.begin() + static_cast<std::ptrdiff_t>(keep_at), keep_n,
                  data.begin() + static_cast<std::ptrdiff_t>(keep_at));
    }
    exchange_reduce(ctx, partner, from.subspan(give_at, give_n), data.subspan(keep_at, keep_n), op, reduce, scratch);
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

/// Rabenseifner allreduce: in place, or from `source` into `data` (equal sizes, no overlap).
template <transport Transport, element T, class Reduction>
void halving_doubling_allreduce(call_context<Transport>& ctx, std::span<T> data, reduce_op op,
                                const Reduction& reduce, scratch_buffer<T>& scratch,
                                std::span<const T> source = {}) {
  // A fold needs the whole vector in `data`; so does one rank. Otherwise the first step sends
  // straight from `source` and copies in only the half it keeps.
  if (!source.empty() && (ctx.size() == 1 || fold_shape(ctx.size()).folded > 0)) {
    std::copy(source.begin(), source.end(), data.begin());
    source = {};
  }
  folded_allreduce(ctx, data, op, reduce, scratch, [&](const fold_shape& f, int me) {
    auto core_offs = balanced_offsets(data.size(), f.core);
    halving_reduce_scatter(ctx, f, me, data, core_offs, op, reduce, scratch, source);
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
    for (int mask = 1; mask < f.core; mask *= 2) {
      const int partner = f.real_rank(me ^ mask);
      exchange_reduce(ctx, partner, std::span<const T>(data), data, op, reduce, scratch);
    }
    if (op == reduce_op::avg) reduce.finish_average(data, ctx.size());
  });
}

}  // namespace dtrain::detail
