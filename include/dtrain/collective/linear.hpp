#pragma once
/// @file
/// Linear algorithms: every transfer posted at once. The root of a gather or scatter talks to
/// each rank directly (p-1 messages, one hop); alltoall posts all p-1 sends and receives together.
/// Fewest copies and hops; they win for few ranks and large blocks.

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "dtrain/collective/context.hpp"

namespace dtrain::detail {

/// Linear gather: the root receives block i of `out` from rank i.
template <transport Transport, element T>
void linear_gather(call_context<Transport>& ctx, std::span<const T> in, std::span<T> out, int root) {
  const int p = ctx.size();
  const int r = ctx.rank();
  const std::size_t n = in.size();
  if (r != root) {
    auto s = ctx.send(root, in);
    ctx.wait(s);
    return;
  }
  using pending = typename call_context<Transport>::pending;
  std::vector<pending> recvs;
  for (int i = 0; i < p; ++i) {
    if (i != root) recvs.push_back(ctx.recv(i, out.subspan(static_cast<std::size_t>(i) * n, n)));
  }
  std::copy(in.begin(), in.end(), out.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(root) * n));
  ctx.wait_all(recvs);
}

/// Linear scatter: the root sends block i of `in` to rank i.
template <transport Transport, element T>
void linear_scatter(call_context<Transport>& ctx, std::span<const T> in, std::span<T> out, int root) {
  const int p = ctx.size();
  const int r = ctx.rank();
  const std::size_t n = out.size();
  if (r != root) {
    auto rq = ctx.recv(root, out);
    ctx.wait(rq);
    return;
  }
  using pending = typename call_context<Transport>::pending;
  std::vector<pending> sends;
  for (int i = 0; i < p; ++i) {
    if (i != root) sends.push_back(ctx.send(i, in.subspan(static_cast<std::size_t>(i) * n, n)));
  }
  auto own = in.subspan(static_cast<std::size_t>(root) * n, n);
  std::copy(own.begin(), own.end(), out.begin());
  ctx.wait_all(sends);
}

/// Linear alltoall: all p-1 receives and sends in flight at once.
template <transport Transport, element T>
void linear_alltoall(call_context<Transport>& ctx, std::span<const T> in, std::span<T> out) {
  const int p = ctx.size();
  const int r = ctx.rank();
  const std::size_t n = in.size() / static_cast<std::size_t>(p);
  using pending = typename call_context<Transport>::pending;
  std::vector<pending> ops;
  for (int s = 1; s < p; ++s) {
    int from = mod(r - s, p);
    ops.push_back(ctx.recv(from, out.subspan(static_cast<std::size_t>(from) * n, n)));
  }
  for (int s = 1; s < p; ++s) {
    int to = mod(r + s, p);
    ops.push_back(ctx.send(to, in.subspan(static_cast<std::size_t>(to) * n, n)));
  }
  auto own = in.subspan(static_cast<std::size_t>(r) * n, n);
  std::copy(own.begin(), own.end(), out.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * n));
  ctx.wait_all(ops);
}

}  // namespace dtrain::detail
