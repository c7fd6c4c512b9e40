#pragma once
/// @file
/// Tree algorithms, rooted at any rank: pipelined broadcast and reduce over a binomial tree or a
/// chain (the "ring" broadcast/reduce for large messages), and binomial-tree gather and scatter.
///
/// Ranks are renumbered relative to the root (v = (rank - root) mod p). In the binomial tree the
/// parent of v is v minus its lowest set bit and its children are v + 2^j for 2^j below that bit;
/// messages are cut into segments and a rank forwards segment k while segment k+1 arrives.

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "dtrain/collective/context.hpp"
#include "dtrain/collective/ring.hpp"
#include "dtrain/concepts/reduction.hpp"
#include "dtrain/detail/scratch_buffer.hpp"

namespace dtrain::detail {

/// A tree over relative ranks: its parent (-1 at the root) and children, in a fixed order.
struct tree_shape {
  int parent = -1;
  std::vector<int> children;
};

inline int lowest_bit(int v) { return v & -v; }

/// The binomial tree position of relative rank `v` in a group of `p`.
inline tree_shape binomial_tree(int v, int p) {
  tree_shape t;
  int limit = v == 0 ? p : lowest_bit(v);
  if (v != 0) t.parent = v - lowest_bit(v);
  for (int mask = 1; mask < limit && v + mask < p; mask *= 2) t.children.push_back(v + mask);
  return t;
}

/// The chain position of relative rank `v`: 0 -> 1 -> ... -> p-1.
inline tree_shape chain(int v, int p) {
  tree_shape t;
  if (v > 0) t.parent = v - 1;
  if (v + 1 < p) t.children.push_back(v + 1);
  return t;
}

/// Size of the binomial subtree rooted at relative rank `v`.
inline int subtree_size(int v, int p) { return v == 0 ? p : std::min(lowest_bit(v), p - v); }

/// Pipelined broadcast of `buf` from `root` down the tree `shape_of(v, p)`.
template <transport Transport, element T, class Shape>
void tree_broadcast(call_context<Transport>& ctx, std::span<T> buf, int root, Shape shape_of) {
  const int p = ctx.size();
  if (p == 1) return;
  const int v = mod(ctx.rank() - root, p);
  tree_shape t = shape_of(v, p);
  std::vector<std::size_t> offs{0, buf.size()};
  segmentation segs(offs, ctx.template segment_elements<T>());
  using pending = typename call_context<Transport>::pending;
  std::vector<pending> recvs, sends;
  if (t.parent >= 0) {
    for (std::size_t k = 0; k < segs.count; ++k) {
      recvs.push_back(ctx.recv(mod(t.parent + root, p), segs.of(buf, 0, k)));
    }
  }
  for (std::size_t k = 0; k < segs.count; ++k) {
    if (t.parent >= 0) ctx.wait(recvs[k]);
    for (int c : t.children) sends.push_back(ctx.send(mod(c + root, p), segs.of(buf, 0, k)));
  }
  ctx.wait_all(sends);
}

/// Pipelined reduce of `in` to `root` up the tree `shape_of(v, p)`; the root's result lands in
/// `out` (`avg` divided). Each rank reduces its children's segments in child order, so results
/// are deterministic.
template <transport Transport, element T, class Reduction, class Shape>
void tree_reduce(call_context<Transport>& ctx, std::span<const T> in, std::span<T> out, int root,
                 reduce_op op, const Reduction& reduce, scratch_buffer<T>& scratch, Shape shape_of) {
  const int p = ctx.size();
  const int v = mod(ctx.rank() - root, p);
  tree_shape t = shape_of(v, p);
  scratch_buffer<T> own;  // an inner rank's running sum (not std::vector: bool must not pack)
  std::span<T> acc;
  if (v == 0) {
    if (in.data() != out.data()) std::copy(in.begin(), in.end(), out.begin());
    acc = out;
  } else if (!t.children.empty()) {
    own.assign(in.begin(), in.end());
    acc = std::span<T>(own);
  }
  std::vector<std::size_t> offs{0, in.size()};
  segmentation segs(offs, ctx.template segment_elements<T>());
  using pending = typename call_context<Transport>::pending;
  // Segments in flight per child. A child sends its first `window` at once; past them it waits
  // for its parent's credits, one per `window / 2` segments the parent has reduced (and posted
  // room for), so no rank holds a child's segments it has no receive for, however far the
  // child could run ahead (a 2 GiB reduce on 4 ranks otherwise held 4 buffers at the root).
  const std::size_t window = 8, credit_every = window / 2;
  const std::size_t credits = segs.count > window ? (segs.count - window + credit_every - 1) / credit_every : 0;
  const std::size_t nchild = t.children.size();
  scratch.resize(nchild * window * segs.seg);
  auto slot = [&](std::size_t c, std::size_t k) {
    auto [lo, hi] = segs.range(0, k);
    return std::span<T>(scratch.data() + (c * window + k % window) * segs.seg, hi - lo);
  };
  std::vector<std::vector<pending>> recvs(nchild);
  auto post = [&](std::size_t k) {
    if (k >= segs.count) return;
    for (std::size_t c = 0; c < nchild; ++c) {
      recvs[c].push_back(ctx.recv(mod(t.children[c] + root, p), slot(c, k)));
    }
  };
  for (std::size_t k = 0; k < window; ++k) post(k);
  std::vector<pending> sends, granted;
  for (std::size_t k = 0; k < segs.count; ++k) {
    for (std::size_t c = 0; c < nchild; ++c) {
      ctx.wait(recvs[c][k]);
      reduce(segs.of(acc, 0, k), std::span<const T>(slot(c, k)), op);
    }
    post(k + window);
    if ((k + 1) % credit_every == 0 && (k + 1) / credit_every <= credits) {
      for (int child : t.children) granted.push_back(ctx.send_control(mod(child + root, p)));
    }
    if (t.parent >= 0) {
      if (k >= window && (k - window) % credit_every == 0) {  // room for the next window / 2 segments
        auto credit = ctx.recv_control(mod(t.parent + root, p));
        ctx.wait(credit);
      }
      std::span<const T> part = nchild == 0 ? segs.of(in, 0, k) : std::span<const T>(segs.of(acc, 0, k));
      sends.push_back(ctx.send(mod(t.parent + root, p), part));
    }
  }
  ctx.wait_all(granted);
  ctx.wait_all(sends);
  if (v == 0 && op == reduce_op::avg) reduce.finish_average(out, p);
}

/// Binomial-tree gather: `out` at the root gets block r = rank r's `in`.
template <transport Transport, element T>
void binomial_gather(call_context<Transport>& ctx, std::span<const T> in, std::span<T> out,
                     int root) {
  const int p = ctx.size();
  const int v = mod(ctx.rank() - root, p);
  const std::size_t n = in.size();
  tree_shape t = binomial_tree(v, p);
  // Subtree blocks in relative order; the root with root 0 can gather straight into `out`.
  scratch_buffer<T> tmp;
  std::span<T> sub;
  if (v == 0 && root == 0) {
    sub = out;
  } else {
    tmp.resize(static_cast<std::size_t>(subtree_size(v, p)) * n);
    sub = std::span<T>(tmp);
  }
  std::copy(in.begin(), in.end(), sub.begin());
  using pending = typename call_context<Transport>::pending;
  std::vector<pending> recvs;
  for (int c : t.children) {
    recvs.push_back(ctx.recv(mod(c + root, p),
                             sub.subspan(static_cast<std::size_t>(c - v) * n,
                                         static_cast<std::size_t>(subtree_size(c, p)) * n)));
  }
  ctx.wait_all(recvs);
  if (t.parent >= 0) {
    auto s = ctx.send(mod(t.parent + root, p), std::span<const T>(sub));
    ctx.wait(s);
  } else if (root != 0) {
    for (int i = 0; i < p; ++i) {
      auto src = sub.subspan(static_cast<std::size_t>(i) * n, n);
      std::copy(src.begin(), src.end(), out.begin() + static_cast<std::ptrdiff_t>(mod(i + root, p) * n));
    }
  }
}

/// Binomial-tree scatter: rank r's `out` gets block r of the root's `in`.
template <transport Transport, element T>
void binomial_scatter(call_context<Transport>& ctx, std::span<const T> in, std::span<T> out,
                      int root) {
  const int p = ctx.size();
  const int v = mod(ctx.rank() - root, p);
  const std::size_t n = out.size();
  tree_shape t = binomial_tree(v, p);
  scratch_buffer<T> tmp;
  std::span<const T> sub;
  if (v == 0) {
    if (root == 0) {
      sub = in;
    } else {
      tmp.resize(static_cast<std::size_t>(p) * n);
      for (int i = 0; i < p; ++i) {
        auto src = in.subspan(static_cast<std::size_t>(mod(i + root, p)) * n, n);
        std::copy(src.begin(), src.end(), tmp.begin() + static_cast<std::ptrdiff_t>(i * n));
      }
      sub = std::span<T>(tmp);
    }
  } else if (t.children.empty()) {
    auto rq = ctx.recv(mod(t.parent + root, p), out);
    ctx.wait(rq);
    return;
  } else {
    tmp.resize(static_cast<std::size_t>(subtree_size(v, p)) * n);
    auto rq = ctx.recv(mod(t.parent + root, p), std::span<T>(tmp));
    ctx.wait(rq);
    sub = std::span<T>(tmp);
  }
  using pending = typename call_context<Transport>::pending;
  std::vector<pending> sends;
  for (int c : t.children) {
    sends.push_back(ctx.send(mod(c + root, p),
                             sub.subspan(static_cast<std::size_t>(c - v) * n,
                                         static_cast<std::size_t>(subtree_size(c, p)) * n)));
  }
  std::copy(sub.begin(), sub.begin() + static_cast<std::ptrdiff_t>(n), out.begin());
  ctx.wait_all(sends);
}

}  // namespace dtrain::detail
