#pragma once
/// @file
/// Double binary tree allreduce (NCCL 2.4; Sanders, Speck and Träff's two-tree algorithms). A
/// single binary tree leaves half its ranks (the leaves) sending once and receiving once, and
/// each inner rank sends to one parent and two children: its links are used unevenly. Two trees
/// fix that: in the first every leaf is an odd rank and every inner node an even one, and the
/// second is the first mirrored (rank r -> p-1-r, when p is even) or shifted by one (r -> r+1,
/// when p is odd), so a rank that is a leaf in one tree is inner in the other. Each tree reduces
/// and broadcasts half of the data, segment by segment, both at once: logarithmic depth like a
/// tree, with every rank sending and receiving about the whole vector once, like a ring.
///
/// The first tree (rooted at 0, the shape of NCCL's btree): a rank's lowest set bit b gives its
/// parent (r ^ b) | 2b (or r ^ b when that is out of range) and its children r - b/2 and the
/// largest r + b/2^j in range; rank 0's one child is half the smallest power of two >= p.

#include <algorithm>
#include <array>
#include <cstddef>
#include <span>
#include <vector>

#include "dtrain/collective/context.hpp"
#include "dtrain/collective/ring.hpp"
#include "dtrain/collective/tree.hpp"
#include "dtrain/concepts/reduction.hpp"
#include "dtrain/detail/scratch_buffer.hpp"

namespace dtrain::detail {

/// Rank `r`'s place in the first tree of `p` ranks (children in ascending order).
inline tree_shape first_btree(int r, int p) {
  tree_shape t;
  int bit = 1;
  while (bit < p && (bit & r) == 0) bit <<= 1;
  if (r == 0) {
    if (p > 1) t.children.push_back(bit >> 1);
    return t;
  }
  t.parent = (r ^ bit) | (bit << 1);
  if (t.parent >= p) t.parent = r ^ bit;
  for (int low = bit >> 1; low > 0; low >>= 1) {  // the left child always exists; the right may not
    if (t.children.empty()) t.children.push_back(r - low);
    if (r + low < p) {
      t.children.push_back(r + low);
      break;
    }
  }
  return t;
}

/// Rank `r`'s place in the second tree: the first, mirrored for even `p`, shifted for odd.
inline tree_shape second_btree(int r, int p) {
  const bool mirror = p % 2 == 0;
  auto to = [&](int x) { return x < 0 ? -1 : mirror ? p - 1 - x : (x + 1) % p; };
  const tree_shape base = first_btree(mirror ? p - 1 - r : (r - 1 + p) % p, p);
  tree_shape t;
  t.parent = to(base.parent);
  for (int c : base.children) t.children.push_back(to(c));
  return t;
}

/// Allreduce of `buf` in place over two binary trees, each carrying one half (`avg` divided).
/// Per segment and tree, a rank reduces its children's partial sums into its own and sends the sum
/// up; one segment later it takes the result from its parent and sends it down. Every wait is
/// for a message its sender posts at the same or an earlier step, and each tree is acyclic: no
/// deadlock.
/// `scratch` is resized to hold the children's segments in flight.
template <transport Transport, element T, class Reduction>
void double_tree_allreduce(call_context<Transport>& ctx, std::span<T> buf, reduce_op op, const Reduction& reduce,
                           scratch_buffer<T>& scratch) {
  const int p = ctx.size();
  if (p == 1) return;
  const int r = ctx.rank();
  const std::array<tree_shape, 2> trees{first_btree(r, p), second_btree(r, p)};
  const std::vector<std::size_t> offs{0, buf.size() / 2, buf.size()};  // tree t carries block t
  const segmentation segs(offs, ctx.template segment_elements<T>());
  constexpr std::size_t window = 2;  // segments in flight per child
  // Segments between the one going up and the one coming down: a segment's round trip to the
  // root is 2 log2 p hops, so with this lag a rank finds the result waiting (the same on every
  // rank: it orders the messages between them).
  std::size_t lag = 1;
  while ((std::size_t{1} << (lag / 2)) < static_cast<std::size_t>(p)) lag += 2;
  // Scratch: per tree, per child (at most 2), per window slot, one segment.
  scratch.resize(2 * 2 * window * segs.seg);
  auto slot = [&](int t, std::size_t c, std::size_t k) {
    auto [lo, hi] = segs.range(t, k);
    return std::span<T>(scratch.data() + ((static_cast<std::size_t>(t) * 2 + c) * window + k % window) * segs.seg,
                        hi - lo);
  };
  using pending = typename call_context<Transport>::pending;
  std::array<std::vector<std::vector<pending>>, 2> up;  // [tree][child][segment]
  std::array<std::vector<pending>, 2> down;             // [tree][segment]
  for (int t = 0; t < 2; ++t)
    up[static_cast<std::size_t>(t)].resize(trees[static_cast<std::size_t>(t)].children.size());
  // Receives are matched in order per peer, so they are posted in the order peers send: step j
  // sends segment j up and then segment j - lag down, both trees in turn.
  auto post = [&](std::size_t j) {
    for (int t = 0; t < 2 && j < segs.count; ++t) {
      const tree_shape& s = trees[static_cast<std::size_t>(t)];
      for (std::size_t c = 0; c < s.children.size(); ++c) {
        up[static_cast<std::size_t>(t)][c].push_back(ctx.recv(s.children[c], slot(t, c, j)));
      }
    }
    for (int t = 0; t < 2 && j >= lag && j - lag < segs.count; ++t) {
      const tree_shape& s = trees[static_cast<std::size_t>(t)];
      if (s.parent >= 0) down[static_cast<std::size_t>(t)].push_back(ctx.recv(s.parent, segs.of(buf, t, j - lag)));
    }
  };
  std::size_t posted = 0;
  auto post_through = [&](std::size_t j) {
    for (; posted <= j; ++posted) post(posted);
  };
  post_through(window - 1);
  std::vector<pending> sends;
  std::array<std::vector<pending>, 2> partials;  // [tree][segment]: sums sent up
  // The order of the two trees in a pass: the one that need not wait first, so its messages
  // leave while this rank waits in the other; unless both send to a common peer, whose
  // receives expect tree 0's message first.
  auto order = [&](bool waits0, bool waits1, const std::vector<int>& to0, const std::vector<int>& to1) {
    const bool shared = std::any_of(to0.begin(), to0.end(),
                                    [&](int q) { return std::find(to1.begin(), to1.end(), q) != to1.end(); });
    return waits0 && !waits1 && !shared ? std::array<int, 2>{1, 0} : std::array<int, 2>{0, 1};
  };
  auto parent_of = [&](int t) {
    const int q = trees[static_cast<std::size_t>(t)].parent;
    return q >= 0 ? std::vector<int>{q} : std::vector<int>{};
  };
  const auto up_order = order(!trees[0].children.empty(), !trees[1].children.empty(), parent_of(0), parent_of(1));
  const auto down_order = order(trees[0].parent >= 0, trees[1].parent >= 0, trees[0].children, trees[1].children);
  // Up: reduce the children's sums of segment k into this rank's and send it to the parent.
  auto up_pass = [&](std::size_t k) {
    for (int t : up_order) {
      const tree_shape& s = trees[static_cast<std::size_t>(t)];
      std::span<T> mine = segs.of(buf, t, k);
      for (std::size_t c = 0; c < s.children.size(); ++c) {
        ctx.wait(up[static_cast<std::size_t>(t)][c][k]);
        reduce(mine, std::span<const T>(slot(t, c, k)), op);
      }
      if (s.parent >= 0) partials[static_cast<std::size_t>(t)].push_back(ctx.send(s.parent, std::span<const T>(mine)));
    }
  };
  // Down: the result of segment k from the parent (into the segment just sent up, so that send
  // must be finished), on to the children.
  auto down_pass = [&](std::size_t k) {
    for (int t : down_order) {
      const tree_shape& s = trees[static_cast<std::size_t>(t)];
      if (s.parent >= 0) {
        ctx.wait(partials[static_cast<std::size_t>(t)][k]);
        ctx.wait(down[static_cast<std::size_t>(t)][k]);
      }
      for (int c : s.children) sends.push_back(ctx.send(c, std::span<const T>(segs.of(buf, t, k))));
    }
  };
  // Segment k goes up while segment k - lag comes down, so a rank does not idle for a round trip
  // to the root between segments. Up waits only for children, down for the parent's down of an
  // earlier segment, which follows its up of this segment: no cycle.
  for (std::size_t j = 0; j < segs.count + lag; ++j) {
    if (j < segs.count) up_pass(j);
    if (j >= lag) down_pass(j - lag);
    post_through(j + window);
  }
  ctx.wait_all(sends);
  if (op == reduce_op::avg) reduce.finish_average(buf, p);
}

}  // namespace dtrain::detail
