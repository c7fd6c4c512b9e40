#pragma once
/// @file
/// `nccl_communicator`: the collective operations on device memory through NCCL (a model of
/// `collective` over `device_memory`). Link `dtrain::nccl`.
///
/// <!-- frame: header_nccl_store -->
/// @code
/// // store: any rendezvous store (the TCP store, the file store); grads: n floats of device memory
/// auto comm = dtrain::nccl_communicator::connect(store, rank, size);
/// comm.allreduce(dtrain::device_span<float>(grads, n), dtrain::reduce_op::avg);  // waits
/// auto r = comm.iallreduce(dtrain::device_span<float>(grads, n), dtrain::reduce_op::sum);
/// // ... other work ...
/// r.wait();                                              // under the communicator's deadline
/// @endcode
///
/// - Start-up: rank 0 creates the NCCL unique id and publishes it through the rendezvous store;
///   the others read it. The communicator is created non-blocking, so joining is bounded by the
///   deadline too (an error names the ranks' count and what never arrived).
/// - Every operation is enqueued on the communicator's CUDA stream. The blocking forms wait for
///   it; the `i*` forms return a `request` that `test`s and `wait`s on a CUDA event. The stream
///   is ordered after the legacy default stream: a buffer written there (a pageable `cudaMemcpy`
///   that returned before its copy landed, a kernel on stream 0) is complete before NCCL reads
///   it. Work on other streams must be complete, or ordered with events on `stream()`.
/// - Waiting polls `ncclCommGetAsyncError` under the same deadline model as the host
///   collectives. A failure or a timeout aborts the communicator (`ncclCommAbort`) and raises a
///   `dtrain::error` naming the operation, its sequence number and the group; later calls raise
///   `errc::broken`. (A lost peer and one that never called the operation both time out.)
/// - gather, scatter and alltoall are grouped `ncclSend`/`ncclRecv` (NCCL 2.7 and later).
/// - Point-to-point (`isend`, `irecv`, `send`, `recv`; formed with `point_to_point` set): tagged
///   messages of device buffers on a lane per ordered pair of ranks (collective/nccl_p2p.hpp).
/// - The flight recorder keeps every collective, under the group "nccl/<key>" (or "nccl over
///   <host group>" for `over`).
/// - One rank per GPU: NCCL refuses two ranks on one device. To share a GPU between ranks, use
///   the staged TCP communicator (`staged_communicator`).
/// Not thread-safe: one call at a time, in the same order on every rank.

#include <nccl.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtrain/collective/nccl_p2p.hpp"
#include "dtrain/collective/nccl_request.hpp"
#include "dtrain/collective/nccl_startup.hpp"
#include "dtrain/collective/nccl_types.hpp"
#include "dtrain/concepts/element.hpp"
#include "dtrain/core/deadline.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/memory_space.hpp"
#include "dtrain/core/reduce_op.hpp"
#include "dtrain/core/signature.hpp"
#include "dtrain/cuda/runtime.hpp"
#include "dtrain/detail/error_code_forms.hpp"
#include "dtrain/flight/recorder.hpp"

namespace dtrain {

struct nccl_options {
  /// Deadline of start-up and of each blocking call (and of `request::wait()`).
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  /// CUDA device; -1: the local rank (DTRAIN_LOCAL_RANK, else the rank) modulo the device count.
  int device = -1;
  /// Store key of the NCCL unique id; groups formed through one store need different keys.
  std::string key = "nccl/unique_id";
  /// Forms the lanes of `isend` and `irecv` at start-up: a two-rank NCCL communicator per
  /// ordered pair of ranks (P - 1 rounds of two ncclCommSplit calls, P rounded up to even).
  bool point_to_point = false;
};

class nccl_communicator : public detail::error_code_forms<nccl_communicator, device_span>,
                          public nccl_p2p_forms<nccl_communicator> {
  using error_code_forms = detail::error_code_forms<nccl_communicator, device_span>;

 public:
  // Each operation's noexcept `std::error_code` form, beside the throwing one defined here.
  using error_code_forms::allgather, error_code_forms::allreduce, error_code_forms::alltoall,
      error_code_forms::barrier, error_code_forms::broadcast, error_code_forms::gather, error_code_forms::reduce,
      error_code_forms::reduce_scatter, error_code_forms::scatter;
  using memory_space = device_memory;

  /// An operation in flight on the communicator's stream (what the `i*` collectives return).
  using request = nccl_request<nccl_communicator>;

  /// Forms the group through `store`. @throws dtrain::error `timeout` when not every rank joins
  ///   in time, `device_error` for CUDA or NCCL failures, `invalid_argument` for a bad rank.
  template <class Store>
  static nccl_communicator connect(Store& store, int rank, int size, nccl_options o = {}) {
    const auto group = detail::nccl::flight_named("nccl/" + o.key, rank, size);
    return form(rank, size, o, group, [&](ncclUniqueId& id, deadline d) {
      detail::nccl::share_id_through_store(store, o.key, rank, id, d);
    });
  }

  /// Forms the group of the ranks of `host`, a host collective (`communicator<tcp_transport>`,
  /// say) that already connects them: rank 0's unique id is broadcast through it, as Horovod
  /// does through MPI. Collective on `host`. @throws as `connect`, and `host`'s errors.
  template <class HostCollective>
  static nccl_communicator over(HostCollective& host, nccl_options o = {}) {
    return form(host.rank(), host.size(), o, detail::nccl::flight_over(host),
                [&](ncclUniqueId& id, deadline) { detail::nccl::share_id_through(host, id); });
  }

  nccl_communicator(nccl_communicator&& o) noexcept
      : comm_(std::exchange(o.comm_, nullptr)),
        rank_(o.rank_),
        size_(o.size_),
        device_(o.device_),
        options_(std::move(o.options_)),
        stream_(std::move(o.stream_)),
        scratch_(std::move(o.scratch_)),
        sequence_(o.sequence_),
        broken_(std::move(o.broken_)),
        events_(std::move(o.events_)),
        p2p_(std::move(o.p2p_)),
        flight_(o.flight_) {}
  nccl_communicator& operator=(nccl_communicator&&) = delete;
  ~nccl_communicator() {
    p2p_.reset();  // the lanes before the communicator they were split from
    if (comm_ != nullptr) {
      cudaStreamSynchronize(stream_.get());
      ncclCommDestroy(comm_);
    }
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  int device() const noexcept { return device_; }
  /// The stream every operation is enqueued on; order other work against it with events.
  cudaStream_t stream() const noexcept { return stream_.get(); }
  const nccl_options& options() const noexcept { return options_; }

  // --- asynchronous forms ----------------------------------------------------------------------

  template <element T>
  request iallreduce(device_span<const T> in, device_span<T> out, reduce_op op) {
    detail::nccl::same_size(in.size(), out.size(), "allreduce");
    return start(detail::nccl::call<T>(coll_op::allreduce, in.size(), op), [&] {
      return ncclAllReduce(in.data(), out.data(), in.size(), detail::nccl::type_of<T>(), detail::nccl::op_of<T>(op),
                           comm_, stream());
    });
  }
  template <element T>
  request iallreduce(device_span<T> buf, reduce_op op) {
    return iallreduce(device_span<const T>(buf), buf, op);
  }
  template <element T>
  request ibroadcast(device_span<T> buf, int root) {
    detail::nccl::check_root(root, size_, "broadcast");
    return start(detail::nccl::call<T>(coll_op::broadcast, buf.size(), reduce_op::sum, root), [&] {
      return ncclBroadcast(buf.data(), buf.data(), buf.size(), detail::nccl::type_of<T>(), root, comm_, stream());
    });
  }

  // --- the collective operations (blocking) ----------------------------------------------------

  template <element T>
  void broadcast(device_span<T> buf, int root) {
    ibroadcast(buf, root).wait();
  }
  template <element T>
  void reduce(std::type_identity_t<device_span<const T>> in, device_span<T> out, reduce_op op, int root) {
    detail::nccl::check_root(root, size_, "reduce");
    if (rank_ == root) detail::nccl::same_size(in.size(), out.size(), "reduce");
    start(detail::nccl::call<T>(coll_op::reduce, in.size(), op, root), [&] {
      return ncclReduce(in.data(), rank_ == root ? out.data() : nullptr, in.size(), detail::nccl::type_of<T>(),
                        detail::nccl::op_of<T>(op), root, comm_, stream());
    }).wait();
  }
  template <element T>
  void reduce(device_span<T> buf, reduce_op op, int root) {
    reduce<T>(device_span<const T>(buf), buf, op, root);
  }
  template <element T>
  void allreduce(std::type_identity_t<device_span<const T>> in, device_span<T> out, reduce_op op) {
    iallreduce<T>(in, out, op).wait();
  }
  template <element T>
  void allreduce(device_span<T> buf, reduce_op op) {
    iallreduce<T>(buf, op).wait();
  }
  template <element T>
  void reduce_scatter(std::type_identity_t<device_span<const T>> in, device_span<T> out, reduce_op op) {
    detail::nccl::same_size(in.size(), out.size() * static_cast<std::size_t>(size_),
                            "reduce_scatter (input = size() blocks)");
    start(detail::nccl::call<T>(coll_op::reduce_scatter, in.size(), op), [&] {
      return ncclReduceScatter(in.data(), out.data(), out.size(), detail::nccl::type_of<T>(),
                               detail::nccl::op_of<T>(op), comm_, stream());
    }).wait();
  }
  template <element T>
  void reduce_scatter(device_span<T> buf, reduce_op op) {
    const std::size_t n = detail::nccl::block(buf.size(), size_, "reduce_scatter");
    reduce_scatter<T>(device_span<const T>(buf), buf.subspan(static_cast<std::size_t>(rank_) * n, n), op);
  }
  template <element T>
  void allgather(std::type_identity_t<device_span<const T>> in, device_span<T> out) {
    detail::nccl::same_size(in.size() * static_cast<std::size_t>(size_), out.size(),
                            "allgather (output = size() blocks)");
    start(detail::nccl::call<T>(coll_op::allgather, in.size()), [&] {
      return ncclAllGather(in.data(), out.data(), in.size(), detail::nccl::type_of<T>(), comm_, stream());
    }).wait();
  }
  template <element T>
  void allgather(device_span<T> buf) {
    const std::size_t n = detail::nccl::block(buf.size(), size_, "allgather");
    allgather<T>(device_span<const T>(buf.subspan(static_cast<std::size_t>(rank_) * n, n)), buf);
  }
  template <element T>
  void gather(std::type_identity_t<device_span<const T>> in, device_span<T> out, int root) {
    detail::nccl::check_root(root, size_, "gather");
    if (rank_ == root)
      detail::nccl::same_size(in.size() * static_cast<std::size_t>(size_), out.size(),
                              "gather (output = size() blocks)");
    const std::size_t n = in.size();
    start(detail::nccl::call<T>(coll_op::gather, in.size(), reduce_op::sum, root), [&] {
      return grouped([&](int p) -> ncclResult_t {
        if (rank_ != root) return p == root ? post_send(in, p) : ncclSuccess;
        return post_recv(out.subspan(static_cast<std::size_t>(p) * n, n), in, p);
      });
    }).wait();
  }
  template <element T>
  void scatter(std::type_identity_t<device_span<const T>> in, device_span<T> out, int root) {
    detail::nccl::check_root(root, size_, "scatter");
    if (rank_ == root)
      detail::nccl::same_size(in.size(), out.size() * static_cast<std::size_t>(size_),
                              "scatter (input = size() blocks)");
    const std::size_t n = out.size();
    start(detail::nccl::call<T>(coll_op::scatter, out.size(), reduce_op::sum, root), [&] {
      return grouped([&](int p) -> ncclResult_t {
        if (rank_ != root) return p == root ? post_recv(out, device_span<const T>{}, p) : ncclSuccess;
        return p == rank_ ? post_recv(out, in.subspan(static_cast<std::size_t>(p) * n, n), p)
                          : post_send(in.subspan(static_cast<std::size_t>(p) * n, n), p);
      });
    }).wait();
  }
  template <element T>
  void alltoall(std::type_identity_t<device_span<const T>> in, device_span<T> out) {
    detail::nccl::same_size(in.size(), out.size(), "alltoall");
    const std::size_t n = detail::nccl::block(in.size(), size_, "alltoall");
    start(detail::nccl::call<T>(coll_op::alltoall, in.size()), [&] {
      return grouped([&](int p) -> ncclResult_t {
        const auto mine = in.subspan(static_cast<std::size_t>(p) * n, n);
        const auto theirs = out.subspan(static_cast<std::size_t>(p) * n, n);
        if (p == rank_) return post_recv(theirs, mine, p);
        if (const ncclResult_t r = post_send(mine, p); r != ncclSuccess) return r;
        return post_recv(theirs, device_span<const T>{}, p);
      });
    }).wait();
  }
  template <element T>
  void alltoall(device_span<T> buf) {
    auto copy = scratch<T>(buf.size());
    cuda::copy_async(copy, device_span<const T>(buf), stream());
    alltoall<T>(device_span<const T>(copy), buf);
  }
  void barrier() {
    auto one = scratch<float>(1);
    allreduce(one, reduce_op::sum);
  }

  /// Why the communicator was aborted; empty while it is healthy.
  const std::string& failure() const noexcept { return *broken_; }

 private:
  friend request;
  friend nccl_p2p_forms<nccl_communicator>;

  nccl_communicator(ncclUniqueId id, int rank, int size, int device, nccl_options o,
                    detail::nccl::flight_names flight, deadline d)
      : rank_(rank),
        size_(size),
        device_(device),
        options_(std::move(o)),
        broken_(std::make_shared<std::string>()),
        flight_(flight.group) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // joining, and every call, then return at once; we wait under deadlines
    check(ncclCommInitRankConfig(&comm_, size, id, rank, &config), "ncclCommInitRankConfig");
    settle("joining the group of " + std::to_string(size) + " ranks (every rank must call connect)", d, true);
    if (!options_.point_to_point) return;
    try {
      p2p_ = std::make_unique<detail::nccl::p2p_engine>(comm_, rank, size, device_, options_.timeout, d,
                                                         flight::p2p_log(flight_, std::move(flight.members)));
    } catch (...) {
      ncclCommAbort(std::exchange(comm_, nullptr));  // no destructor runs for a constructor that throws
      throw;
    }
  }

  detail::nccl::p2p_engine& lanes(const char* what, int peer) {
    if (!p2p_) {
      throw error(errc::invalid_argument, std::string("nccl ") + what +
                                              ": this communicator was formed without point-to-point lanes "
                                              "(set nccl_options::point_to_point on every rank)");
    }
    if (peer < 0 || peer >= size_) {
      throw error(errc::invalid_argument, std::string("nccl ") + what + ": peer " + std::to_string(peer) +
                                              " outside a group of " + std::to_string(size_));
    }
    return *p2p_;
  }

  static void check(ncclResult_t r, const char* what) {
    if (r != ncclSuccess && r != ncclInProgress) {
      throw error(errc::device_error, std::string("nccl: ") + what + ": " + detail::nccl::text(r));
    }
  }

  std::string name(const std::string& what) const {
    return "nccl " + what + " #" + std::to_string(sequence_) + " (rank " + std::to_string(rank_) + " of " +
           std::to_string(size_) + ", device " + std::to_string(device_) + ")";
  }

  [[noreturn]] void fail(errc code, const std::string& why) {
    *broken_ = why;
    if (comm_ != nullptr) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    throw error(code, why);
  }

  // Waits until the communicator leaves ncclInProgress (non-blocking mode) or `d` passes.
  void settle(const std::string& what, deadline d, bool joining = false) {
    for (;;) {
      ncclResult_t state = ncclSuccess;
      check(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) {
        const std::string hint = joining ? detail::nccl::joining_hint(state, device_) : "";
        fail(errc::device_error, "nccl: " + what + ": " + detail::nccl::text(state) + hint + "; communicator aborted");
      }
      if (d.expired()) fail(errc::timeout, "nccl: " + what + ": not done within the deadline; communicator aborted");
      std::this_thread::yield();
    }
  }

  void check_async(const std::string& what) {
    const cuda::on_device here(device_);  // the caller's thread may have another current
    if (comm_ == nullptr) throw error(errc::broken, "nccl: " + what + ": the communicator was aborted: " + *broken_);
    ncclResult_t state = ncclSuccess;
    check(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
    if (state != ncclSuccess && state != ncclInProgress) {
      fail(errc::device_error,
           what + ": " + detail::nccl::text(state) + " (a peer failed or was lost); communicator aborted");
    }
  }

  // Polls `e` and NCCL's error state: spinning for the first 2 ms, so that the end of an
  // operation is seen within microseconds, then every 20 us, so that a long wait does not hold a
  // core (a sleep overshoots by tens of microseconds: a few percent of a wait that long).
  void wait_for(const cuda::event& e, const std::string& what, deadline d) {
    const cuda::on_device here(device_);
    const auto spin_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(2);
    for (;;) {
      if (e.ready()) return;
      check_async(what);
      if (d.expired()) {
        fail(errc::timeout, what + ": not complete within the deadline; a peer is lost, slow, or not calling the same "
                                   "operation; communicator aborted");
      }
      if (std::chrono::steady_clock::now() > spin_until) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  // Enqueues `enqueue()` (an NCCL call or group) and records its completion.
  template <class F>
  request start(signature sig, F&& enqueue) {
    const cuda::on_device here(device_);  // its stream and events are this device's
    sig.seq = ++sequence_;
    const std::string full = name(std::string(coll_op_name(sig.op)));
    const flight::recorder::handle call = flight::recorder::global().start(flight_, sig);
    try {
      if (comm_ == nullptr) throw error(errc::broken, full + ": the communicator was aborted: " + *broken_);
      const ncclResult_t r = enqueue();
      if (r != ncclSuccess && r != ncclInProgress) fail(errc::device_error, full + ": " + detail::nccl::text(r));
      settle(full, deadline::after(options_.timeout));
    } catch (const error& e) {
      call.failed(flight::recorder::intern(e.what()));
      throw;
    }
    request q;
    q.flight_ = call;
    q.owner_ = this;
    q.event_ = free_event();
    q.event_->record(stream());
    q.what_ = full;
    return q;
  }

  // A completion event no request holds any more, else a new one: creating a CUDA event costs
  // microseconds, a noticeable share of a blocking call on a few MiB.
  std::shared_ptr<cuda::event> free_event() {
    for (const auto& e : events_) {
      if (e.use_count() == 1) return e;
    }
    auto e = std::make_shared<cuda::event>();
    if (events_.size() < 16) events_.push_back(e);
    return e;
  }

  // Calls f(p) for every rank p inside one NCCL group.
  template <class F>
  ncclResult_t grouped(F&& f) {
    if (const ncclResult_t r = ncclGroupStart(); r != ncclSuccess) return r;
    ncclResult_t first = ncclSuccess;
    for (int p = 0; p < size_ && first == ncclSuccess; ++p) first = f(p);
    const ncclResult_t end = ncclGroupEnd();
    return first != ncclSuccess ? first : end;
  }

  template <class T>
  ncclResult_t post_send(device_span<const T> b, int peer) {
    return ncclSend(b.data(), b.size(), detail::nccl::type_of<T>(), peer, comm_, stream());
  }
  // Receives `b` from `peer`; from itself, copies `self` (a device-to-device copy on the stream).
  template <class T>
  ncclResult_t post_recv(device_span<T> b, device_span<const T> self, int peer) {
    if (peer == rank_) {
      return cudaMemcpyAsync(b.data(), self.data(), self.size_bytes(), cudaMemcpyDeviceToDevice, stream()) ==
                     cudaSuccess
                 ? ncclSuccess
                 : ncclUnhandledCudaError;
    }
    return ncclRecv(b.data(), b.size(), detail::nccl::type_of<T>(), peer, comm_, stream());
  }

  template <class T>
  device_span<T> scratch(std::size_t n) {
    const std::size_t bytes = n * sizeof(T);
    if (scratch_.size() < bytes) scratch_ = cuda::device_buffer<std::byte>(bytes);
    return {reinterpret_cast<T*>(scratch_.data()), n};
  }

  // Picks the device, makes rank 0's unique id, lets `exchange(id, deadline)` hand it to every
  // rank, and initialises the communicator.
  template <class Exchange>
  static nccl_communicator form(int rank, int size, const nccl_options& o, detail::nccl::flight_names flight,
                                Exchange&& exchange) {
    detail::nccl::check_rank(rank, size);
    const deadline d = deadline::after(o.timeout);
    const int device = detail::nccl::device_for(rank, o.device);
    cuda::check(cudaSetDevice(device), "cudaSetDevice");
    ncclUniqueId id{};
    if (rank == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    exchange(id, d);
    return nccl_communicator(id, rank, size, device, o, std::move(flight), d);
  }

  ncclComm_t comm_ = nullptr;
  int rank_ = 0, size_ = 1, device_ = 0;
  nccl_options options_;
  cuda::stream stream_ = cuda::stream::ordered_with_default();  // after the caller's stream-0 work
  cuda::device_buffer<std::byte> scratch_;
  std::uint64_t sequence_ = 0;
  std::shared_ptr<std::string> broken_;
  std::vector<std::shared_ptr<cuda::event>> events_;  // completion events, reused
  std::unique_ptr<detail::nccl::p2p_engine> p2p_;     // point-to-point lanes, when formed with them
  flight::recorder::group_info flight_{};             // what the flight recorder names this group
};

}  // namespace dtrain
