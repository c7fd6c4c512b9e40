#include "process_group.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>

#include "dtrain/topology/hosts.hpp"
#include "tensors.hpp"

namespace dtrain::torch_backend {
namespace {

// Every group alive in this process, for close_all. Never freed: a group may outlive the
// static destructors that run at exit.
std::mutex& live_groups_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::unordered_set<dtrain_process_group*>& live_groups() {
  static auto* groups = new std::unordered_set<dtrain_process_group*>;
  return *groups;
}

}  // namespace

dtrain_process_group::dtrain_process_group(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                                           std::chrono::milliseconds timeout)
    : c10d_backend(rank, size),
      timeout_(timeout),
      comm_(std::in_place, form_group(store, rank, size, timeout, world_)) {
  // The ranks agree whether every host has two cores per rank: large allreduces then take the
  // ring, whose reduction overlaps its transfers (cost_model::reduction_overlaps).
  comm_->algorithms().model().reduction_overlaps = discover_hosts(comm_->transport()).two_cores_per_rank;
  std::lock_guard lock(live_groups_mutex());
  live_groups().insert(this);
}

dtrain_process_group::~dtrain_process_group() {
  {
    std::lock_guard lock(live_groups_mutex());
    live_groups().erase(this);
  }
  close();
}

void dtrain_process_group::close_all() noexcept {
  std::lock_guard lock(live_groups_mutex());
  for (auto* group : live_groups()) group->close();
}

void dtrain_process_group::close() noexcept {
  // Python's destroy calls this holding the GIL, and a call's last reference to a tensor, freed
  // on a queue's thread, can need the GIL: let go of it while those threads finish.
  std::optional<pybind11::gil_scoped_release> without_gil;
  if (Py_IsInitialized() != 0 && PyGILState_Check() != 0) without_gil.emplace();
  point_to_point_.stop();  // fails the receives still waiting; the sends get the linger time
  collectives_.stop();
  comm_.reset();
  world_.reset();  // the last group of a world says goodbye to its peers
}

c10::intrusive_ptr<c10d_backend> dtrain_process_group::create(const c10::intrusive_ptr<::c10d::Store>& store, int rank,
                                                              int size, const std::chrono::duration<float>& timeout) {
  return c10::make_intrusive<dtrain_process_group>(store, rank, size,
                                                   std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
}

std::chrono::milliseconds dtrain_process_group::timeout_of(std::chrono::milliseconds asked) const {
  return asked == ::c10d::kUnsetTimeout ? timeout_.load() : asked;
}

dtrain_process_group::work_ptr dtrain_process_group::enqueue(detail::call_queue& queue, ::c10d::OpType type,
                                                             tensors inputs, tensors outputs,
                                                             std::chrono::milliseconds timeout, host_staging staging,
                                                             std::function<void()> body) {
  auto no_source = [body = std::move(body)] {
    body();
    return -1;
  };
  return enqueue_from(queue, type, std::move(inputs), std::move(outputs), timeout, std::move(staging), no_source);
}

dtrain_process_group::work_ptr dtrain_process_group::enqueue_from(detail::call_queue& queue, ::c10d::OpType type,
                                                                  tensors inputs, tensors outputs,
                                                                  std::chrono::milliseconds timeout,
                                                                  host_staging staging, std::function<int()> body) {
  TORCH_CHECK(comm_.has_value(), "dtrain: ", ::c10d::opTypeToString(type), " on a group that was shut down");
  const char* what = profiling_title(type) + std::string_view("dtrain:").size();
  auto work = c10::make_intrusive<dtrain_work>(getRank(), type, std::move(inputs), std::move(outputs),
                                               std::move(staging), what, timeout);
  calls_.fetch_add(1);
  queue.submit([this, &queue, work, timeout, body = std::move(body)] {
    // c10d's calls are not differentiable: they write their tensors as NCCL does, without
    // autograd's in-place checks (a leaf that requires grad may be a call's output).
    const c10::NoGradGuard no_autograd;
    std::exception_ptr failure;
    int source = -1;
    try {
      if (&queue == &collectives_) comm_->set_timeout(timeout);  // the p2p thread leaves it alone
      work->staging().await_host_copies();
      work->running_as(comm_->sequence());
      source = body();
      work->staging().copy_back();
    } catch (...) {
      failure = as_torch_error(std::current_exception());
    }
    work->complete(failure, source);
  });
  return work;
}

// Each call checks its tensors, then asks `host_staging` for the host tensors its body uses:
// the ones it reads, the ones it fills, and the ones it does both to. On CPU tensors those are
// the tensors themselves.

dtrain_process_group::work_ptr dtrain_process_group::broadcast(tensors& t, const ::c10d::BroadcastOptions& o) {
  for (const auto& x : t) check_tensor(x, "broadcast");
  const int root = static_cast<int>(o.rootRank);
  host_staging staging(host_staging::device_of(t), "broadcast");
  tensors hosts = staging.read_write(t);
  return enqueue(collectives_, ::c10d::OpType::BROADCAST, t, t, timeout_of(o.timeout), std::move(staging),
                 [this, hosts, root] {
                   for (const auto& x : hosts) {
                     dense d(x);
                     with_element(x, "broadcast", [&]<class T>(T) { comm_->broadcast(span_of<T>(d.data), root); });
                     d.write_back();
                   }
                 });
}

dtrain_process_group::work_ptr dtrain_process_group::allreduce(tensors& t, const ::c10d::AllreduceOptions& o) {
  if (!t.empty() && t[0].is_sparse()) return sparse_allreduce(t, o);
  for (const auto& x : t) check_tensor(x, "allreduce");
  const reduce_op op = reduction_of(o.reduceOp, "allreduce");
  host_staging staging(host_staging::device_of(t), "allreduce");
  tensors hosts = staging.read_write(t);
  return enqueue(collectives_, ::c10d::OpType::ALLREDUCE, t, t, timeout_of(o.timeout), std::move(staging),
                 [this, hosts, op] {
                   for (const auto& x : hosts) {
                     dense d(x);
                     with_element(x, "allreduce", [&]<class T>(T) { comm_->allreduce(span_of<T>(d.data), op); });
                     d.write_back();
                   }
                 });
}

dtrain_process_group::work_ptr dtrain_process_group::allreduce_coalesced(tensors& t,
                                                                         const ::c10d::AllreduceCoalescedOptions& o) {
  check_coalesced(t, "allreduce_coalesced");
  const reduce_op op = reduction_of(o.reduceOp, "allreduce_coalesced");
  host_staging staging(host_staging::device_of(t), "allreduce_coalesced");
  tensors hosts = staging.read_write(t);
  return enqueue(collectives_, ::c10d::OpType::ALLREDUCE_COALESCED, t, t, timeout_of(o.timeout), std::move(staging),
                 [this, xs = hosts, op]() mutable {
                   at::Tensor flat = joined(xs);
                   with_element(flat, "allreduce_coalesced",
                                [&]<class T>(T) { comm_->allreduce(span_of<T>(flat), op); });
                   split_into(flat, xs);
                 });
}

dtrain_process_group::work_ptr dtrain_process_group::reduce(tensors& t, const ::c10d::ReduceOptions& o) {
  check_one(t, "reduce");
  const reduce_op op = reduction_of(o.reduceOp, "reduce");
  const int root = static_cast<int>(o.rootRank);
  host_staging staging(t[0].device(), "reduce");
  at::Tensor host = staging.read_write(t[0]);
  return enqueue(collectives_, ::c10d::OpType::REDUCE, t, t, timeout_of(o.timeout), std::move(staging),
                 [this, x = host, op, root] {
                   dense d(x);
                   with_element(x, "reduce", [&]<class T>(T) { comm_->reduce(span_of<T>(d.data), op, root); });
                   d.write_back();
                 });
}

dtrain_process_group::work_ptr dtrain_process_group::allgather(tensor_lists& out, tensors& in,
                                                               const ::c10d::AllgatherOptions& o) {
  check_one(in, "allgather");
  check_list(out, getSize(), in[0], "allgather", "output");
  host_staging staging(in[0].device(), "allgather");
  at::Tensor x = staging.read(in[0]);
  tensors ys = staging.write(out[0]);
  return enqueue(collectives_, ::c10d::OpType::ALLGATHER, in, out[0], timeout_of(o.timeout), std::move(staging),
                 [this, x, ys]() mutable {
                   const at::Tensor src = x.contiguous();
                   at::Tensor flat = at::empty({src.numel() * getSize()}, src.options());
                   with_element(x, "allgather", [&]<class T>(T) {
                     comm_->allgather(std::span<const T>(span_of<T>(src)), span_of<T>(flat));
                   });
                   split_into(flat, ys);
                 });
}

dtrain_process_group::work_ptr dtrain_process_group::_allgather_base(at::Tensor& out, at::Tensor& in,
                                                                     const ::c10d::AllgatherOptions& o) {
  check_blocks(out, in, getSize(), "allgather into one tensor");
  host_staging staging(in.device(), "allgather into one tensor");
  at::Tensor x = staging.read(in);
  at::Tensor y = staging.write(out);
  return enqueue(collectives_, ::c10d::OpType::_ALLGATHER_BASE, {in}, {out}, timeout_of(o.timeout), std::move(staging),
                 [this, x, y] {
                   const at::Tensor src = x.contiguous();
                   dense d(y);
                   with_element(x, "allgather", [&]<class T>(T) {
                     comm_->allgather(std::span<const T>(span_of<T>(src)), span_of<T>(d.data));
                   });
                   d.write_back();
                 });
}

at::Tensor dtrain_process_group::allgather_joined(const tensors& in) {
  const at::Tensor flat_in = joined(in);
  at::Tensor flat_out = at::empty({getSize(), flat_in.numel()}, flat_in.options());
  with_element(flat_in, "allgather_coalesced",
               [&]<class T>(T) { comm_->allgather(std::span<const T>(span_of<T>(flat_in)), span_of<T>(flat_out)); });
  return flat_out;
}

dtrain_process_group::work_ptr dtrain_process_group::allgather_coalesced(tensor_lists& out, tensors& in,
                                                                         const ::c10d::AllgatherOptions& o) {
  // out[r][i] receives rank r's in[i]
  check_coalesced(in, "allgather_coalesced");
  TORCH_CHECK(static_cast<int>(out.size()) == getSize(), "dtrain: allgather_coalesced: ", out.size(),
              " output lists for ", getSize(), " ranks");
  tensors outputs;
  for (const auto& from_rank : out) {
    TORCH_CHECK(from_rank.size() == in.size(), "dtrain: allgather_coalesced: output lists of ", from_rank.size(),
                " tensors for ", in.size(), " inputs");
    for (std::size_t i = 0; i < in.size(); ++i) check_blocks(from_rank[i], in[i], 1, "allgather_coalesced");
    outputs.insert(outputs.end(), from_rank.begin(), from_rank.end());
  }
  host_staging staging(in[0].device(), "allgather_coalesced");
  tensors xs = staging.read(in);
  tensor_lists ys;
  for (const auto& from_rank : out) ys.push_back(staging.write(from_rank));
  return enqueue(collectives_, ::c10d::OpType::ALLGATHER_COALESCED, in, outputs, timeout_of(o.timeout),
                 std::move(staging), [this, xs, ys]() mutable {
                   const at::Tensor rows = allgather_joined(xs);
                   for (int r = 0; r < getSize(); ++r) split_into(rows[r], ys[static_cast<std::size_t>(r)]);
                 });
}

#if DTRAIN_TORCH_AT_LEAST(2, 2)
dtrain_process_group::work_ptr dtrain_process_group::allgather_into_tensor_coalesced(
    tensors& out, tensors& in, const ::c10d::AllgatherOptions& o) {
  check_coalesced_blocks(out, in, getSize(), "allgather_into_tensor_coalesced");
  host_staging staging(in[0].device(), "allgather_into_tensor_coalesced");
  tensors xs = staging.read(in);
  tensors ys = staging.write(out);
  return enqueue(collectives_, ::c10d::OpType::COALESCED, in, out, timeout_of(o.timeout), std::move(staging),
                 [this, xs, ys]() mutable {
                   const at::Tensor rows = allgather_joined(xs);
                   std::int64_t at = 0;
                   for (std::size_t i = 0; i < xs.size(); ++i) {
                     ys[i].copy_(rows.narrow(1, at, xs[i].numel()).reshape(ys[i].sizes()));
                     at += xs[i].numel();
                   }
                 });
}

dtrain_process_group::work_ptr dtrain_process_group::reduce_scatter_tensor_coalesced(
    tensors& out, tensors& in, const ::c10d::ReduceScatterOptions& o) {
  check_coalesced_blocks(in, out, getSize(), "reduce_scatter_tensor_coalesced");
  const reduce_op op = reduction_of(o.reduceOp, "reduce_scatter_tensor_coalesced");
  host_staging staging(in[0].device(), "reduce_scatter_tensor_coalesced");
  tensors xs = staging.read(in);
  tensors ys = staging.write(out);
  return enqueue(collectives_, ::c10d::OpType::COALESCED, in, out, timeout_of(o.timeout), std::move(staging),
                 [this, xs, ys, op]() mutable {
                   // Rank r's blocks of every input, side by side in row r: one reduce_scatter for all.
                   tensors rows;
                   for (const auto& x : xs) rows.push_back(x.reshape({getSize(), x.numel() / getSize()}));
                   const at::Tensor send = at::cat(rows, 1);
                   at::Tensor mine = at::empty({send.size(1)}, send.options());
                   with_element(send, "reduce_scatter_tensor_coalesced", [&]<class T>(T) {
                     comm_->reduce_scatter(std::span<const T>(span_of<T>(send)), span_of<T>(mine), op);
                   });
                   split_into(mine, ys);
                 });
}
#endif

dtrain_process_group::work_ptr dtrain_process_group::gather(tensor_lists& out, tensors& in,
                                                            const ::c10d::GatherOptions& o) {
  check_one(in, "gather");
  const int root = static_cast<int>(o.rootRank);
  const tensors outputs = root_list(out, getRank(), root, getSize(), in[0], "gather", "output");
  host_staging staging(in[0].device(), "gather");
  at::Tensor x = staging.read(in[0]);
  tensors ys = staging.write(outputs);
  return enqueue(collectives_, ::c10d::OpType::GATHER, in, outputs, timeout_of(o.timeout), std::move(staging),
                 [this, x, ys, root]() mutable {
                   const at::Tensor src = x.contiguous();
                   at::Tensor flat = ys.empty() ? at::empty({0}, src.options())
                                                : at::empty({src.numel() * getSize()}, src.options());
                   with_element(x, "gather", [&]<class T>(T) {
                     comm_->gather(std::span<const T>(span_of<T>(src)), span_of<T>(flat), root);
                   });
                   if (!ys.empty()) split_into(flat, ys);
                 });
}

dtrain_process_group::work_ptr dtrain_process_group::scatter(tensors& out, tensor_lists& in,
                                                             const ::c10d::ScatterOptions& o) {
  check_one(out, "scatter");
  const int root = static_cast<int>(o.rootRank);
  const tensors inputs = root_list(in, getRank(), root, getSize(), out[0], "scatter", "input");
  host_staging staging(out[0].device(), "scatter");
  tensors xs = staging.read(inputs);
  at::Tensor y = staging.write(out[0]);
  return enqueue(collectives_, ::c10d::OpType::SCATTER, inputs, out, timeout_of(o.timeout), std::move(staging),
                 [this, xs, y, root] {
                   const at::Tensor flat = xs.empty() ? at::empty({0}, y.options()) : joined(xs);
                   dense d(y);
                   with_element(y, "scatter", [&]<class T>(T) {
                     comm_->scatter(std::span<const T>(span_of<T>(flat)), span_of<T>(d.data), root);
                   });
                   d.write_back();
                 });
}

dtrain_process_group::work_ptr dtrain_process_group::reduce_scatter(tensors& out, tensor_lists& in,
                                                                    const ::c10d::ReduceScatterOptions& o) {
  check_one(out, "reduce_scatter");
  const std::vector<std::size_t> counts = block_counts(in, getSize(), getRank(), out[0], "reduce_scatter");
  const bool even = std::all_of(counts.begin(), counts.end(), [&](std::size_t n) { return n == counts[0]; });
  const reduce_op op = reduction_of(o.reduceOp, "reduce_scatter");
  host_staging staging(out[0].device(), "reduce_scatter");
  tensors xs = staging.read(in[0]);
  at::Tensor y = staging.write(out[0]);
  return enqueue(collectives_, ::c10d::OpType::REDUCE_SCATTER, in[0], out, timeout_of(o.timeout), std::move(staging),
                 [this, xs, y, op, counts, even] {
                   const at::Tensor flat = joined(xs);
                   dense d(y);
                   with_element(y, "reduce_scatter", [&]<class T>(T) {
                     if (even) {
                       comm_->reduce_scatter(std::span<const T>(span_of<T>(flat)), span_of<T>(d.data), op);
                     } else {  // each rank's block of its own size
                       comm_->reduce_scatterv(std::span<const T>(span_of<T>(flat)), counts, span_of<T>(d.data), op);
                     }
                   });
                   d.write_back();
                 });
}

dtrain_process_group::work_ptr dtrain_process_group::_reduce_scatter_base(at::Tensor& out, at::Tensor& in,
                                                                          const ::c10d::ReduceScatterOptions& o) {
  check_blocks(in, out, getSize(), "reduce_scatter from one tensor");
  const reduce_op op = reduction_of(o.reduceOp, "reduce_scatter");
  host_staging staging(in.device(), "reduce_scatter from one tensor");
  at::Tensor x = staging.read(in);
  at::Tensor y = staging.write(out);
  return enqueue(collectives_, ::c10d::OpType::_REDUCE_SCATTER_BASE, {in}, {out}, timeout_of(o.timeout),
                 std::move(staging), [this, x, y, op] {
                   const at::Tensor src = x.contiguous();
                   dense d(y);
                   with_element(y, "reduce_scatter", [&]<class T>(T) {
                     comm_->reduce_scatter(std::span<const T>(span_of<T>(src)), span_of<T>(d.data), op);
                   });
                   d.write_back();
                 });
}

dtrain_process_group::work_ptr dtrain_process_group::alltoall_base(at::Tensor& out, at::Tensor& in,
                                                                   std::vector<std::int64_t>& out_splits,
                                                                   std::vector<std::int64_t>& in_splits,
                                                                   const ::c10d::AllToAllOptions& o) {
  check_tensor(in, "alltoall");
  check_tensor(out, "alltoall");
  check_same(in, out, "alltoall");
  const auto send = split_counts(in, in_splits, getSize(), "input");
  const auto receive = split_counts(out, out_splits, getSize(), "output");
  const bool even = in_splits.empty() && out_splits.empty();
  host_staging staging(in.device(), "alltoall");
  at::Tensor x = staging.read(in);
  at::Tensor y = staging.write(out);
  return enqueue(collectives_, ::c10d::OpType::ALLTOALL_BASE, {in}, {out}, timeout_of(o.timeout), std::move(staging),
                 [this, x, y, send, receive, even] {
                   const at::Tensor src = x.contiguous();
                   dense d(y);
                   with_element(x, "alltoall", [&]<class T>(T) {
                     if (even) {
                       comm_->alltoall(std::span<const T>(span_of<T>(src)), span_of<T>(d.data));
                     } else {
                       comm_->alltoallv(std::span<const T>(span_of<T>(src)), send, span_of<T>(d.data), receive);
                     }
                   });
                   d.write_back();
                 });
}

dtrain_process_group::work_ptr dtrain_process_group::alltoall(tensors& out, tensors& in,
                                                              const ::c10d::AllToAllOptions& o) {
  TORCH_CHECK(static_cast<int>(in.size()) == getSize() && static_cast<int>(out.size()) == getSize(),
              "dtrain: alltoall needs ", getSize(), " input and output tensors, got ", in.size(), " and ", out.size());
  for (const auto& x : in) check_tensor(x, "alltoall");
  for (const auto& y : out) {
    check_tensor(y, "alltoall");
    check_same(in[0], y, "alltoall");
  }
  host_staging staging(in[0].device(), "alltoall");
  tensors xs = staging.read(in);
  tensors ys = staging.write(out);
  return enqueue(collectives_, ::c10d::OpType::ALLTOALL, in, out, timeout_of(o.timeout), std::move(staging),
                 [this, xs, ys]() mutable {
                   const at::Tensor flat_in = joined(xs);
                   const auto send = counts_of(xs), receive = counts_of(ys);
                   const auto received = std::accumulate(receive.begin(), receive.end(), std::size_t{0});
                   at::Tensor flat_out = at::empty({static_cast<std::int64_t>(received)}, flat_in.options());
                   with_element(flat_in, "alltoall", [&]<class T>(T) {
                     comm_->alltoallv(std::span<const T>(span_of<T>(flat_in)), send, span_of<T>(flat_out), receive);
                   });
                   split_into(flat_out, ys);
                 });
}

dtrain_process_group::work_ptr dtrain_process_group::barrier(const ::c10d::BarrierOptions& o) {
  return enqueue(collectives_, ::c10d::OpType::BARRIER, {}, {}, timeout_of(o.timeout),
                 host_staging(c10::kCPU, "barrier"), [this] { comm_->barrier(); });
}

}  // namespace dtrain::torch_backend
