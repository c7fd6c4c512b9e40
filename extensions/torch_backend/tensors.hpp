#pragma once
// The tensors c10d hands a backend, as dtrain's host collectives take them: the dtrain element
// of a dtype, the checks every call makes (each error names the call), contiguous views of
// strided tensors, and joining and splitting lists of tensors into one buffer.

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "dtrain/core/element.hpp"
#include "dtrain/core/reduce_op.hpp"
#include "process_group.hpp"

namespace dtrain::torch_backend {

// Calls f(T{}) with the dtrain element of `t`'s dtype.
template <class F>
inline void with_element(const at::Tensor& t, const char* op, F&& f) {
  switch (t.scalar_type()) {
    case at::kFloat: return f(float{});
    case at::kDouble: return f(double{});
    case at::kInt: return f(std::int32_t{});
    case at::kLong: return f(std::int64_t{});
    case at::kHalf: return f(dtrain::float16{});
    case at::kBFloat16: return f(dtrain::bfloat16{});
    case at::kByte: return f(std::uint8_t{});
    case at::kChar: return f(std::int8_t{});
    case at::kBool: return f(bool{});
    default:
      TORCH_CHECK(false, "dtrain: ", op, " of a ", t.scalar_type(),
                  " tensor: dtrain moves float32, float64, float16, bfloat16, int32, int64, int8, uint8 and bool");
  }
}

inline reduce_op reduction_of(const ::c10d::ReduceOp& op, const char* what) {
  switch (op.op_) {
    case ::c10d::ReduceOp::SUM: return reduce_op::sum;
    case ::c10d::ReduceOp::AVG: return reduce_op::avg;
    case ::c10d::ReduceOp::PRODUCT: return reduce_op::prod;
    case ::c10d::ReduceOp::MIN: return reduce_op::min;
    case ::c10d::ReduceOp::MAX: return reduce_op::max;
    case ::c10d::ReduceOp::BAND: return reduce_op::band;
    case ::c10d::ReduceOp::BOR: return reduce_op::bor;
    case ::c10d::ReduceOp::BXOR: return reduce_op::bxor;
    default:
      TORCH_CHECK(false, "dtrain: ", what, " with reduce op ", static_cast<int>(op.op_),
                  ": dtrain reduces with SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR and BXOR (no pre-multiplied sum)");
  }
}

inline void check_tensor(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.defined(), "dtrain: ", what, ": an undefined tensor");
  TORCH_CHECK(t.device().is_cpu() || t.device().is_cuda(), "dtrain: ", what, ": a tensor on ", t.device(),
              "; the dtrain backend moves CPU and CUDA tensors");
  TORCH_CHECK(t.layout() == at::kStrided, "dtrain: ", what, ": sparse tensors are not supported");
}

inline void check_one(const std::vector<at::Tensor>& t, const char* what) {
  TORCH_CHECK(t.size() == 1, "dtrain: ", what, " takes one tensor per call, got ", t.size());
  check_tensor(t[0], what);
}

inline void check_same(const at::Tensor& a, const at::Tensor& b, const char* what) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "dtrain: ", what, ": tensors of ", a.scalar_type(), " and ",
              b.scalar_type());
}

// The one list of `size` tensors a call takes beside `one` (allgather's and gather's outputs,
// scatter's and reduce_scatter's inputs), each of one's dtype. @returns their element counts
inline std::vector<std::size_t> list_counts(const std::vector<std::vector<at::Tensor>>& lists, int size,
                                            const at::Tensor& one, const char* what, const char* role) {
  TORCH_CHECK(lists.size() == 1 && static_cast<int>(lists[0].size()) == size, "dtrain: ", what, " needs one list of ",
              size, " ", role, " tensors");
  std::vector<std::size_t> counts;
  for (const auto& t : lists[0]) {
    check_tensor(t, what);
    check_same(one, t, what);
    counts.push_back(static_cast<std::size_t>(t.numel()));
  }
  return counts;
}

// That list, each tensor also of one's element count.
inline void check_list(const std::vector<std::vector<at::Tensor>>& lists, int size, const at::Tensor& one,
                       const char* what, const char* role) {
  for (std::size_t n : list_counts(lists, size, one, what, role)) {
    TORCH_CHECK(n == static_cast<std::size_t>(one.numel()), "dtrain: ", what, ": ", role, " tensors of ", n,
                " elements beside one of ", one.numel());
  }
}

// reduce_scatter's list of inputs: the one for this rank of `own`'s size, the others of their
// rank's output's size, which may differ (as Gloo takes them). @returns the element count of
// each, the blocks of a reduce_scatterv
inline std::vector<std::size_t> block_counts(const std::vector<std::vector<at::Tensor>>& lists, int size, int rank,
                                             const at::Tensor& own, const char* what) {
  const std::vector<std::size_t> counts = list_counts(lists, size, own, what, "input");
  TORCH_CHECK(counts[static_cast<std::size_t>(rank)] == static_cast<std::size_t>(own.numel()), "dtrain: ", what,
              ": the input for this rank (", rank, ") holds ", counts[static_cast<std::size_t>(rank)],
              " elements but the output ", own.numel());
  return counts;
}

// `whole` holds `size` blocks the shape of `block` (allgather's output, reduce_scatter's input).
inline void check_blocks(const at::Tensor& whole, const at::Tensor& block, int size, const char* what) {
  check_tensor(whole, what);
  check_tensor(block, what);
  check_same(whole, block, what);
  TORCH_CHECK(whole.numel() == block.numel() * size, "dtrain: ", what, ": a tensor of ", whole.numel(),
              " elements for ", size, " blocks of ", block.numel());
}

// The coalesced calls join their tensors into one buffer, so every tensor has the first's dtype
// (as Gloo and NCCL require).
inline void check_coalesced(const std::vector<at::Tensor>& list, const char* what) {
  TORCH_CHECK(!list.empty(), "dtrain: ", what, ": no tensors");
  for (const auto& t : list) {
    check_tensor(t, what);
    check_same(list[0], t, what);
  }
}

#if DTRAIN_TORCH_AT_LEAST(2, 2)
// The coalesced into-tensor calls: wholes[i] holds `size` blocks the shape of blocks[i].
inline void check_coalesced_blocks(const std::vector<at::Tensor>& wholes, const std::vector<at::Tensor>& blocks,
                                   int size, const char* what) {
  check_coalesced(blocks, what);
  TORCH_CHECK(wholes.size() == blocks.size(), "dtrain: ", what, ": ", wholes.size(), " whole tensors for ",
              blocks.size(), " blocks");
  for (std::size_t i = 0; i < blocks.size(); ++i) check_blocks(wholes[i], blocks[i], size, what);
}
#endif

// The root's list for gather (outputs) and scatter (inputs), checked; other ranks pass none.
inline std::vector<at::Tensor> root_list(const std::vector<std::vector<at::Tensor>>& lists, int rank, int root,
                                         int size, const at::Tensor& one, const char* what, const char* role) {
  if (rank != root) {
    TORCH_CHECK(lists.empty() || lists[0].empty(), "dtrain: ", what, ": only the root (rank ", root, ") passes ", role,
                " tensors");
    return {};
  }
  check_list(lists, size, one, what, role);
  return lists[0];
}

// A contiguous tensor holding `t`'s data: `t` itself when it is contiguous, else a copy that
// `write_back` copies into `t` once the collective has filled it.
struct dense {
  explicit dense(const at::Tensor& t) : original(t), data(t.contiguous()) {}
  void write_back() {
    if (!data.is_same(original)) original.copy_(data);
  }
  at::Tensor original, data;
};

template <class T>
std::span<T> span_of(const at::Tensor& t) {
  return {static_cast<T*>(t.data_ptr()), static_cast<std::size_t>(t.numel())};
}

// The tensors of `list`, flattened and joined in order (one contiguous buffer).
inline at::Tensor joined(const std::vector<at::Tensor>& list) {
  std::vector<at::Tensor> flat;
  flat.reserve(list.size());
  for (const auto& t : list) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}

// Copies consecutive pieces of `flat` into the tensors of `list`.
inline void split_into(const at::Tensor& flat, std::vector<at::Tensor>& list) {
  std::int64_t at = 0;
  for (auto& t : list) {
    t.copy_(flat.narrow(0, at, t.numel()).view(t.sizes()));
    at += t.numel();
  }
}

inline std::vector<std::size_t> counts_of(const std::vector<at::Tensor>& list) {
  std::vector<std::size_t> c;
  for (const auto& t : list) c.push_back(static_cast<std::size_t>(t.numel()));
  return c;
}

// Elements per rank of an alltoall_base buffer: `splits` rows each (empty: equal shares).
inline std::vector<std::size_t> split_counts(const at::Tensor& t, const std::vector<std::int64_t>& splits, int size,
                                             const char* side) {
  const std::int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  const std::int64_t row = rows == 0 ? 0 : t.numel() / rows;
  std::vector<std::size_t> c;
  if (splits.empty()) {
    TORCH_CHECK(rows % size == 0, "dtrain: alltoall: the ", side, " tensor's ", rows, " rows do not split evenly over ",
                size, " ranks");
    c.assign(static_cast<std::size_t>(size), static_cast<std::size_t>(rows / size * row));
    return c;
  }
  TORCH_CHECK(static_cast<int>(splits.size()) == size, "dtrain: alltoall: ", splits.size(), " ", side, " splits for ",
              size, " ranks");
  TORCH_CHECK(std::accumulate(splits.begin(), splits.end(), std::int64_t{0}) == rows, "dtrain: alltoall: the ", side,
              " splits do not add up to the tensor's ", rows, " rows");
  for (auto s : splits) c.push_back(static_cast<std::size_t>(s * row));
  return c;
}

}  // namespace dtrain::torch_backend
