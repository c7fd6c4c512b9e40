#pragma once
/// @file
/// The barriers.
///  - Dissemination (Hensgen, Finkel and Manber): ceil(log2 p) rounds; in round k a rank signals
///    rank + 2^k and waits for rank - 2^k. After the last round every rank has heard, directly or
///    transitively, from every other. ceil(log2 p) latencies, p * ceil(log2 p) messages.
///  - Binomial tree: every rank reports to its parent once its subtree has, and rank 0 releases
///    the tree the same way down. 2 * ceil(log2 p) latencies but only 2 (p - 1) messages, which
///    matters where messages, not latency, are the cost (many ranks on few links).

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "dtrain/collective/context.hpp"
#include "dtrain/collective/tree.hpp"

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

template <transport Transport>
void tree_barrier(call_context<Transport>& ctx) {
  const int p = ctx.size();
  const tree_shape t = binomial_tree(ctx.rank(), p);  // rooted at rank 0
  using pending = typename call_context<Transport>::pending;
  const std::span<std::int32_t> none{};
  std::vector<pending> arrivals;
  for (int c : t.children) arrivals.push_back(ctx.recv(c, none));
  ctx.wait_all(arrivals);
  if (t.parent >= 0) {
    pending up = ctx.send(t.parent, none);
    pending release = ctx.recv(t.parent, none);
    ctx.wait(up);
    ctx.wait(release);
  }
  std::vector<pending> releases;
  for (int c : t.children) releases.push_back(ctx.send(c, none));
  ctx.wait_all(releases);
}

}  // namespace dtrain::detail
