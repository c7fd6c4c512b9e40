#pragma once
// dtrain as a torch.distributed backend: a c10d backend whose collectives are dtrain's host
// communicator over dtrain's TCP transport. torch 2 splits the group users hold (ProcessGroup)
// from the backend that runs its collectives (c10d::Backend), and this class is the latter;
// torch 1.13 has the one class, ProcessGroup, and this class derives from that instead.
//
// Every collective is queued on the group's collective thread and runs there in the order it
// was called (c10d's contract: every rank calls the same collectives in the same order); its
// `Work` completes on that thread. Sends and receives are posted in call order on a second thread
// and complete independently (point_to_point.hpp): a receive waiting for its message holds up
// neither a collective nor a later send. Each call runs under the group's timeout (or the call's
// own, where PyTorch passes one), and a failure names the peer and the operation.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/version.h>
#include <vector>
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif

#define DTRAIN_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

#include "dtrain/collective/communicator.hpp"
#include "dtrain/collective/request.hpp"
#include "host_staging.hpp"
#include "point_to_point.hpp"
#include "shared_world.hpp"
#include "work.hpp"

namespace dtrain::torch_backend {

#if TORCH_VERSION_MAJOR >= 2
using c10d_backend = ::c10d::Backend;
#else
using c10d_backend = ::c10d::ProcessGroup;
#endif

class dtrain_process_group final : public c10d_backend {
 public:
  /// Forms the group through `store` (its peers' addresses meet there), as c10d's creator does.
  dtrain_process_group(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout);
  ~dtrain_process_group() override;

  /// The creator torch.distributed calls for `init_process_group("dtrain")` and `new_group`.
  static c10::intrusive_ptr<c10d_backend> create(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                                                 const std::chrono::duration<float>& timeout);

  const std::string getBackendName() const override { return "dtrain"; }

  /// c10d's sequence numbers (`_set_sequence_number_for_group`, `_get_...`), which torch's
  /// desync detection and debugging tools read: the calls the group has been given, collectives,
  /// sends and receives (as Gloo counts them). They agree across ranks as Gloo's do, without an
  /// exchange: every rank makes the same collectives, a send and its receive count one on each
  /// side, and all start at 0 when the group forms; setting them starts them at 0 again.
  void setSequenceNumberForGroup() override { calls_.store(0); }
  std::uint64_t getSequenceNumberForGroup() override { return calls_.load(); }

  /// Closes every group alive in this process. The module runs it at interpreter exit (atexit),
  /// while Python still works: a group never destroyed would otherwise end during finalization,
  /// and a thread of its that dropped a tensor's last reference then needs the GIL Python no
  /// longer hands out (it ends such a thread, which aborted the process).
  static void close_all() noexcept;

  using work_ptr = c10::intrusive_ptr<::c10d::Work>;
  using tensors = std::vector<at::Tensor>;
  using tensor_lists = std::vector<std::vector<at::Tensor>>;

  work_ptr broadcast(tensors& t, const ::c10d::BroadcastOptions& o) override;
  work_ptr allreduce(tensors& t, const ::c10d::AllreduceOptions& o) override;
  work_ptr allreduce_coalesced(tensors& t, const ::c10d::AllreduceCoalescedOptions& o) override;
  work_ptr reduce(tensors& t, const ::c10d::ReduceOptions& o) override;
  work_ptr allgather(tensor_lists& out, tensors& in, const ::c10d::AllgatherOptions& o) override;
  work_ptr _allgather_base(at::Tensor& out, at::Tensor& in, const ::c10d::AllgatherOptions& o) override;
  work_ptr allgather_coalesced(tensor_lists& out, tensors& in, const ::c10d::AllgatherOptions& o) override;
#if DTRAIN_TORCH_AT_LEAST(2, 2)  // the coalesced into-tensor calls FSDP and DTensor make
  work_ptr allgather_into_tensor_coalesced(tensors& out, tensors& in, const ::c10d::AllgatherOptions& o) override;
  work_ptr reduce_scatter_tensor_coalesced(tensors& out, tensors& in, const ::c10d::ReduceScatterOptions& o) override;
#endif
  work_ptr gather(tensor_lists& out, tensors& in, const ::c10d::GatherOptions& o) override;
  work_ptr scatter(tensors& out, tensor_lists& in, const ::c10d::ScatterOptions& o) override;
  work_ptr reduce_scatter(tensors& out, tensor_lists& in, const ::c10d::ReduceScatterOptions& o) override;
  work_ptr _reduce_scatter_base(at::Tensor& out, at::Tensor& in, const ::c10d::ReduceScatterOptions& o) override;
  work_ptr alltoall_base(at::Tensor& out, at::Tensor& in, std::vector<std::int64_t>& out_splits,
                         std::vector<std::int64_t>& in_splits, const ::c10d::AllToAllOptions& o) override;
  work_ptr alltoall(tensors& out, tensors& in, const ::c10d::AllToAllOptions& o) override;
  work_ptr barrier(const ::c10d::BarrierOptions& o) override;
  work_ptr send(tensors& t, int dst, int tag) override;
  work_ptr recv(tensors& t, int src, int tag) override;
  work_ptr recvAnysource(tensors& t, int tag) override;

  /// `monitored_barrier`: every rank tells rank 0 it has arrived, and rank 0, once all have or
  /// its timeout has passed, tells them the verdict; rank 0 names the ranks that did not come
  /// (the first, or all with `waitAllRanks`), in Gloo's words, and every rank that came fails
  /// at once with the same verdict (Gloo's wait for the group's timeout).
  void monitoredBarrier(const ::c10d::BarrierOptions& o, bool waitAllRanks = false) override;

#if DTRAIN_TORCH_AT_LEAST(2, 7)
  /// `destroy_process_group`: ends the group now (Python may hold this object past it).
  void shutdown() override { close(); }
#endif
#if DTRAIN_TORCH_AT_LEAST(2, 9)
  /// `group.set_timeout(t)`: the deadline of every call made from now on that names none itself.
  void setTimeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }
#endif

 private:
  // Queues `body` on `queue`; the work completes when it has run (or failed). `body` works on
  // the host tensors `staging` gave out; `inputs` (the profilers' shapes, as Gloo records them)
  // and `outputs` are the caller's.
  work_ptr enqueue(detail::call_queue& queue, ::c10d::OpType type, tensors inputs, tensors outputs,
                   std::chrono::milliseconds timeout, host_staging staging, std::function<void()> body);
  // The same, for a body that returns the rank its message came from (`Work::sourceRank`).
  work_ptr enqueue_from(detail::call_queue& queue, ::c10d::OpType type, tensors inputs, tensors outputs,
                        std::chrono::milliseconds timeout, host_staging staging, std::function<int()> body);
  // A receive on the user's `tag` into `t[0]`, from `src` or any peer; the work's source rank is
  // the sender.
  work_ptr receive(::c10d::OpType type, tensors& t, int src, int tag);
  // Posts a send or receive (`start`) on the point-to-point thread, to finish before `due`;
  // `finish` runs once it has succeeded and returns the sender (none: -1). `what` names it in
  // errors ("send to rank 2 (tag 7)"). The profilers show `t` as its input, as Gloo's do.
  work_ptr post(::c10d::OpType type, tensors t, host_staging staging, std::string what, deadline due,
                std::function<point_to_point::request()> start,
                std::function<int(point_to_point::request&)> finish = nullptr);
  std::chrono::milliseconds timeout_of(std::chrono::milliseconds asked) const;
  // allreduce of one sparse COO tensor (sparse.cpp): a sum, coalesced, alike on every rank.
  work_ptr sparse_allreduce(tensors& t, const ::c10d::AllreduceOptions& o);
  // Allgathers the tensors of `in` joined into one buffer: one collective for all of them.
  // @returns the gathered buffer as [size, total elements of `in`], rank r's inputs in row r.
  at::Tensor allgather_joined(const tensors& in);

  // Finishes the queued calls (a waiting receive is cancelled), then says goodbye to the peers.
  void close() noexcept;

  std::atomic<std::chrono::milliseconds> timeout_;  // set_timeout may come from any Python thread
  std::atomic<std::uint64_t> calls_{0};  // calls made so far (c10d's sequence number)
  std::atomic<std::uint64_t> monitored_barriers_{0};  // each one's messages travel on a tag of their own
  std::shared_ptr<shared_world> world_;  // the connections this group shares; null once closed
  std::optional<communicator<group_transport>> comm_;  // empty once closed
  detail::call_queue collectives_;  // after comm_: destroyed (drained) before it
  point_to_point point_to_point_;
};

}  // namespace dtrain::torch_backend
