#pragma once
/// @file
/// Linear algorithms: every transfer posted at once. The root of a gather or scatter talks to
/// each rank directly (p-1 messages, one hop); alltoall posts all p-1 sends and receives together.
/// Fewest copies and hops; they win for few ranks and large blocks. Blocks are given by offsets
/// (rank i's block is [offs[i], offs[i+1])), so the same code runs the even and the `v` forms.

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "dtrain/collective/context.hpp"

namespace dtrain::detail {

/// Block i of `data` under `offs`.
template <class T>
std::span<T> block_of(std::span<T> data, const std::vector<std::size_t>& offs, int i) {
  const auto b = static_cast<std::size_t>(i);
  return data.subspan(offs[b], offs[b + 1] - offs[b]);
}

/// Linear gather: the root receives block i of `out` (under `offs`) from rank i.
template <transport Transport, element T>
void linear_gather(call_context<Transport>& ctx, std::span<const T> in, std::span<T> out, int root,
                   const std::vector<std::size_t>& offs) {
  const int p = ctx.size();
  if (ctx.rank() != root) {
    auto s = ctx.send(root, in);
    ctx.wait(s);
    return;
  }
  using pending = typename call_context<Transport>::pending;
  std::vector<pending> recvs;
  for (int i = 0; i < p; ++i) {
    if (i != root) recvs.push_back(ctx.recv(i, block_of(out, offs, i)));
  }
  std::copy(in.begin(), in.end(), block_of(out, offs, root).begin());
  ctx.wait_all(recvs);
}

/// Linear scatter: the root sends block i of `in` (under `offs`) to rank i.
template <transport Transport, element T>
void linear_scatter(call_context<Transport>& ctx, std::span<const T> in, std::span<T> out, int root,
                    const std::vector<std::size_t>& offs) {
  const int p = ctx.size();
  if (ctx.rank() != root) {
    auto rq = ctx.recv(root, out);
    ctx.wait(rq);
    return;
  }
  using pending = typename call_context<Transport>::pending;
  std::vector<pending> sends;
  for (int i = 0; i < p; ++i) {
    if (i != root) sends.push_back(ctx.send(i, block_of(in, offs, i)));
  }
  auto own = block_of(in, offs, root);
  std::copy(own.begin(), own.end(), out.begin());
  ctx.wait_all(sends);
}

/// Linear alltoall: all p-1 receives and sends in flight at once. Block j of `in` (under
/// `send_offs`) goes to rank j; block i of `out` (under `recv_offs`) comes from rank i.
template <transport Transport, element T>
void linear_alltoall(call_context<Transport>& ctx, std::span<const T> in, std::span<T> out,
                     const std::vector<std::size_t>& send_offs, const std::vector<std::size_t>& recv_offs) {
  const int p = ctx.size();
  const int r = ctx.rank();
  using pending = typename call_context<Transport>::pending;
  std::vector<pending> ops;
  for (int s = 1; s < p; ++s) {
    int from = mod(r - s, p);
    ops.push_back(ctx.recv(from, block_of(out, recv_offs, from)));
  }
  for (int s = 1; s < p; ++s) {
    int to = mod(r + s, p);
    ops.push_back(ctx.send(to, block_of(in, send_offs, to)));
  }
  auto own = block_of(in, send_offs, r);
  std::copy(own.begin(), own.end(), block_of(out, recv_offs, r).begin());
  ctx.wait_all(ops);
}

}  // namespace dtrain::detail
