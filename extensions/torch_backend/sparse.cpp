// allreduce of a sparse COO tensor (embedding gradients with sparse=True, which DDP reduces this
// way): as Gloo's, a sum, and the result coalesced. Every rank's indices and values travel to every
// rank, and each rank adds them up in rank order, so every rank ends with the same tensor, bit
// for bit. The values travel as bytes, so every dtype torch's sparse tensors take works.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "process_group.hpp"
#include "tensors.hpp"

namespace dtrain::torch_backend {
namespace {

std::span<std::uint8_t> bytes_of(const at::Tensor& t) {
  return {static_cast<std::uint8_t*>(t.data_ptr()), static_cast<std::size_t>(t.nbytes())};
}

// What every rank's tensor must agree on, and its number of entries (first).
std::vector<std::int64_t> layout_of(const at::Tensor& x) {
  std::vector<std::int64_t> layout = {x._nnz(), x.sparse_dim(), x.dense_dim(),
                                      static_cast<std::int64_t>(x.scalar_type())};
  for (const auto size : x.sizes()) layout.push_back(size);
  return layout;
}

}  // namespace

dtrain_process_group::work_ptr dtrain_process_group::sparse_allreduce(tensors& t, const ::c10d::AllreduceOptions& o) {
  TORCH_CHECK(t.size() == 1, "dtrain: allreduce of sparse tensors takes one tensor per call, got ", t.size());
  TORCH_CHECK(t[0].layout() == at::kSparse, "dtrain: allreduce of a ", t[0].layout(),
              " tensor: dtrain reduces dense (strided) and sparse COO tensors");
  TORCH_CHECK(t[0].device().is_cpu(), "dtrain: allreduce of a sparse tensor on ", t[0].device(),
              ": dtrain reduces sparse tensors on the CPU (move it with .cpu())");
  TORCH_CHECK(o.reduceOp == ::c10d::ReduceOp::SUM, "dtrain: allreduce of a sparse tensor with reduce op ",
              static_cast<int>(o.reduceOp.op_), ": sparse tensors are summed (ReduceOp.SUM), as Gloo's are");
  return enqueue(collectives_, ::c10d::OpType::ALLREDUCE, t, t, timeout_of(o.timeout),
                 host_staging(c10::kCPU, "allreduce"), [this, x = t[0]]() mutable {
                   const c10::NoGradGuard no_autograd;  // the result lands in the caller's tensor
                   const at::Tensor mine = x.coalesce();
                   const int size = getSize();
                   // Every rank's layout: its length first, then the layout itself.
                   const std::vector<std::int64_t> layout = layout_of(mine);
                   const auto length = static_cast<std::int64_t>(layout.size());
                   std::vector<std::int64_t> ranks_dims(static_cast<std::size_t>(size));
                   comm_->allgather(std::span(&length, 1), std::span(ranks_dims));
                   for (int r = 0; r < size; ++r) {
                     const std::int64_t theirs = ranks_dims[static_cast<std::size_t>(r)];
                     TORCH_CHECK(theirs == ranks_dims[0], "dtrain: allreduce of sparse tensors: rank ", r,
                                 "'s tensor has ", theirs - 4, " dimensions, rank 0's ", ranks_dims[0] - 4);
                   }
                   std::vector<std::int64_t> layouts(layout.size() * static_cast<std::size_t>(size));
                   comm_->allgather(std::span<const std::int64_t>(layout), std::span(layouts));
                   std::int64_t most = 0;
                   for (int r = 0; r < size; ++r) {
                     const auto theirs = std::span(layouts).subspan(static_cast<std::size_t>(r) * layout.size(),
                                                                    layout.size());
                     TORCH_CHECK(std::equal(theirs.begin() + 1, theirs.end(), layout.begin() + 1),
                                 "dtrain: allreduce of sparse tensors: rank ", r, "'s tensor differs from rank ",
                                 getRank(), "'s in its sizes, sparse or dense dimensions or dtype (this rank: ",
                                 mine.sizes(), ", ", mine.scalar_type(), ")");
                     most = std::max(most, theirs[0]);
                   }
                   if (most == 0) {  // no rank has an entry: the sum has none
                     x.copy_(mine);
                     return;
                   }
                   // Indices and values, each rank's padded to `most` entries, then gathered.
                   const std::int64_t sparse_dims = mine.sparse_dim();
                   at::Tensor indices = at::zeros({sparse_dims, most}, at::kLong);
                   indices.narrow(1, 0, mine._nnz()).copy_(mine._indices());
                   std::vector<std::int64_t> value_shape = mine._values().sizes().vec();
                   value_shape[0] = most;
                   at::Tensor values = at::zeros(value_shape, mine._values().options());
                   values.narrow(0, 0, mine._nnz()).copy_(mine._values());
                   at::Tensor all_indices = at::empty({size, sparse_dims, most}, at::kLong);
                   value_shape.insert(value_shape.begin(), size);
                   at::Tensor all_values = at::empty(value_shape, values.options());
                   comm_->allgather(span_of<std::int64_t>(indices), span_of<std::int64_t>(all_indices));
                   comm_->allgather(bytes_of(values), bytes_of(all_values));
                   std::vector<at::Tensor> index_parts, value_parts;
                   for (int r = 0; r < size; ++r) {
                     const std::int64_t nnz = layouts[static_cast<std::size_t>(r) * layout.size()];
                     index_parts.push_back(all_indices[r].narrow(1, 0, nnz));
                     value_parts.push_back(all_values[r].narrow(0, 0, nnz));
                   }
                   const at::Tensor sum =
                       at::sparse_coo_tensor(at::cat(index_parts, 1), at::cat(value_parts, 0), mine.sizes())
                           .coalesce();
                   x.copy_(sum);
                 });
}

}  // namespace dtrain::torch_backend
