#pragma once
/// @file
/// `staged_communicator<Transport>`: the collective operations on Thrust-device buffers over
/// a host transport (TCP), staging through host memory and reducing on the device with Thrust.
/// Several ranks can then share one GPU (NCCL refuses that), and hosts without NCCL still train
/// on GPUs. Link `dtrain::thrust` (and `dtrain::cuda` in a CUDA build).
///
/// In a CUDA build (THRUST_DEVICE_SYSTEM CUDA) buffers are `device_span`, staging buffers are
/// pinned, and copies and reductions are enqueued on the communicator's stream. Under Thrust's
/// CPP and OMP systems the same code runs on host buffers (`std::span`), which is how it is
/// tested on machines without a GPU.
///
/// Reducing operations (allreduce, reduce_scatter, reduce) are bandwidth-optimal and
/// deterministic: each rank stages its buffer out, an alltoall hands rank r block r of every
/// rank, rank r combines them on the device in rank order (the same bits everywhere), and an
/// allgather returns the result. Data-moving operations stage out, run the host communicator's
/// algorithm, and stage back. Deadlines, mismatch detection and errors are the host
/// communicator's.
///
/// Point-to-point: `isend`/`irecv` (and the blocking `send`/`recv`) move one device buffer to one
/// peer on a tag, checked on arrival for type and size (collective/staged_p2p.hpp).
///
/// <!-- frame: header_staged_tcp -->
/// @code
/// dtrain::staged_communicator<dtrain::tcp_transport> comm(dtrain::tcp_transport::from_environment());
/// comm.allreduce(dtrain::thrust_buffer<float>(grads, n), dtrain::reduce_op::avg);  // device_span under CUDA
/// @endcode

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <system_error>
#include <type_traits>
#include <utility>

#include "dtrain/collective/communicator.hpp"
#include "dtrain/collective/staged_p2p.hpp"
#include "dtrain/concepts/element.hpp"
#include "dtrain/concepts/transport.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/memory_space.hpp"
#include "dtrain/cuda/thrust_space.hpp"
#include "dtrain/detail/error_code_forms.hpp"
#include "dtrain/flight/recorded.hpp"
#include "dtrain/reduce/thrust.hpp"

namespace dtrain {

namespace detail::staging {

// Pinned host blocks and device scratch; copies on one stream, waited for before the host reads.
// The stream is ordered after the legacy default stream, so a caller's buffer written there (a
// pageable cudaMemcpy, a kernel on stream 0) is complete before it is staged out.
// Under Thrust's host systems "device" memory is host memory and staging is a copy.
class memory {
 public:
  template <class T>
  using host_block = thrust_space::pinned<T>;
  template <class T>
  using device_block = thrust_space::buffer<T>;

  template <class T>
  void to_host(std::span<T> dst, thrust_buffer<const T> src) {
    thrust_space::download<T>(dst, src, stream_.get());
  }
  template <class T>
  void to_device(thrust_buffer<T> dst, std::span<const T> src) {
    thrust_space::upload<T>(dst, src, stream_.get());
  }
  template <class T>
  void on_device(thrust_buffer<T> dst, thrust_buffer<const T> src) {
    thrust_space::copy<T>(dst, src, stream_.get());
  }
  void finish() { thrust_space::synchronize(stream_.get()); }
  auto reduction() const { return reduction_on(stream_.get()); }

 private:
  thrust_space::owned_stream stream_ = thrust_space::ordered_with_default();
};

}  // namespace detail::staging

template <transport Transport>
class staged_communicator : public detail::error_code_forms<staged_communicator<Transport>, thrust_buffer> {
  using error_code_forms = detail::error_code_forms<staged_communicator, thrust_buffer>;

 public:
  // Each operation's noexcept `std::error_code` form, beside the throwing one defined here.
  using error_code_forms::allgather, error_code_forms::allreduce, error_code_forms::alltoall,
      error_code_forms::barrier, error_code_forms::broadcast, error_code_forms::gather, error_code_forms::reduce,
      error_code_forms::reduce_scatter, error_code_forms::scatter;
  using memory_space = thrust_device_memory;

  explicit staged_communicator(Transport t, communicator_options o = {}) : host_(std::move(t), std::move(o)) {}

  int rank() const noexcept { return host_.rank(); }
  int size() const noexcept { return host_.size(); }
  /// The host communicator that moves the staged bytes (its options, timeout, sequence).
  communicator<Transport>& host() noexcept { return host_; }

  // --- data-moving operations: stage out, host algorithm, stage back ---------------------------

  template <element T>
  void broadcast(thrust_buffer<T> buf, int root) {
    in_place_through_host<T>(buf, [&](std::span<T> h) { host_.broadcast(h, root); });
  }
  template <element T>
  void allgather(std::type_identity_t<thrust_buffer<const T>> in, thrust_buffer<T> out) {
    through_host<T>(in, out, true, [&](std::span<const T> i, std::span<T> o) { host_.allgather(i, o); });
  }
  template <element T>
  void allgather(thrust_buffer<T> buf) {
    in_place_through_host<T>(buf, [&](std::span<T> h) { host_.allgather(h); });
  }
  template <element T>
  void gather(std::type_identity_t<thrust_buffer<const T>> in, thrust_buffer<T> out, int root) {
    through_host<T>(in, out, rank() == root, [&](std::span<const T> i, std::span<T> o) { host_.gather(i, o, root); });
  }
  template <element T>
  void scatter(std::type_identity_t<thrust_buffer<const T>> in, thrust_buffer<T> out, int root) {
    const auto sent = rank() == root ? in : thrust_buffer<const T>{};
    through_host<T>(sent, out, true, [&](std::span<const T> i, std::span<T> o) { host_.scatter(i, o, root); });
  }
  template <element T>
  void alltoall(std::type_identity_t<thrust_buffer<const T>> in, thrust_buffer<T> out) {
    through_host<T>(in, out, true, [&](std::span<const T> i, std::span<T> o) { host_.alltoall(i, o); });
  }
  template <element T>
  void alltoall(thrust_buffer<T> buf) {
    in_place_through_host<T>(buf, [&](std::span<T> h) { host_.alltoall(h); });
  }
  void barrier() { host_.barrier(); }

  // --- point-to-point: tagged messages of device buffers ----------------------------------------

  using p2p_message = staged_request<decltype(std::declval<Transport&>().isend(0, 0, signature{},
                                                                          std::span<const std::byte>{}))>;
  /// What `isend` and `irecv` return: a `staged_request` with its flight record.
  using p2p_request = flight::recorded<p2p_message>;

  /// Starts sending `buf` to `peer` on `tag` (any tag but the collectives', `host().options().tag`).
  /// Copies `buf` out before it returns, so the caller may reuse it at once; never waits for the
  /// peer. `sig`, if given, travels with the message (its type and count are `buf`'s): a caller
  /// that checks more than type and size (a pipeline's micro-batch) reads it from the receive's
  /// `info().sig`.
  template <class T>
    requires element<std::remove_const_t<T>>
  p2p_request isend(int peer, std::uint64_t tag, thrust_buffer<T> buf, signature sig = {}) {
    p2p_message r = start_message<std::remove_const_t<T>>(peer, tag, buf.size(), false, sig);
    const auto bytes = r.block_.bytes();
    detail::thrust_space::download<std::byte>(bytes, as_bytes(buf), p2p_->stream.get());
    r.request_ = host_transport().isend(peer, tag, r.want_, std::span<const std::byte>(bytes));
    const signature sent = r.want_;
    return p2p_->log.post(std::move(r), peer, tag, true, sent);
  }
  /// Starts receiving `buf.size()` elements from `peer` on `tag` into `buf`, written when the
  /// request's `wait` succeeds. A message of another type or size fails it with
  /// `errc::collective_mismatch`.
  template <element T>
  p2p_request irecv(int peer, std::uint64_t tag, thrust_buffer<T> buf) {
    p2p_message r = start_message<T>(peer, tag, buf.size(), true, {});
    r.destination_ = thrust_buffer<std::byte>(reinterpret_cast<std::byte*>(buf.data()), buf.size_bytes());
    r.request_ = host_transport().irecv(peer, tag, r.block_.bytes());
    const signature expected = r.want_;
    return p2p_->log.post(std::move(r), peer, tag, false, expected);
  }
  /// `isend` waited for under the communicator's timeout.
  template <class T>
    requires element<std::remove_const_t<T>>
  void send(int peer, std::uint64_t tag, thrust_buffer<T> buf) {
    isend(peer, tag, buf).wait(deadline::after(host_.options().timeout));
  }
  /// `irecv` waited for under the communicator's timeout.
  template <element T>
  void recv(int peer, std::uint64_t tag, thrust_buffer<T> buf) {
    irecv(peer, tag, buf).wait(deadline::after(host_.options().timeout));
  }

  // --- reducing operations: alltoall, combine on the device in rank order, allgather -----------

  template <element T>
  void allreduce(std::type_identity_t<thrust_buffer<const T>> in, thrust_buffer<T> out, reduce_op op) {
    same_size(in.size(), out.size(), "allreduce");
    const std::size_t block = blocks_of(in.size());
    auto mine = reduce_blocks<T>(in, block, op);  // this rank's block of the result, staged
    std::span<T> gathered = host_block<T>(3, block * static_cast<std::size_t>(size()));
    host_.allgather(std::span<const T>(mine), gathered);
    stage_in<T>(out, gathered.first(out.size()));
  }
  template <element T>
  void allreduce(thrust_buffer<T> buf, reduce_op op) {
    allreduce<T>(thrust_buffer<const T>(buf), buf, op);
  }
  template <element T>
  void reduce_scatter(std::type_identity_t<thrust_buffer<const T>> in, thrust_buffer<T> out, reduce_op op) {
    same_size(in.size(), out.size() * static_cast<std::size_t>(size()), "reduce_scatter (input = size() blocks)");
    auto mine = reduce_blocks<T>(in, out.size(), op);
    stage_in<T>(out, mine);
  }
  template <element T>
  void reduce_scatter(thrust_buffer<T> buf, reduce_op op) {
    if (buf.size() % static_cast<std::size_t>(size()) != 0) {
      throw error(errc::invalid_argument, "staged reduce_scatter: " + std::to_string(buf.size()) +
                                              " elements do not split into " + std::to_string(size()) + " blocks");
    }
    const std::size_t n = buf.size() / static_cast<std::size_t>(size());
    reduce_scatter<T>(thrust_buffer<const T>(buf), buf.subspan(static_cast<std::size_t>(rank()) * n, n), op);
  }
  /// The root gets the reduction (through an allreduce: the other ranks' `out` is not touched).
  template <element T>
  void reduce(std::type_identity_t<thrust_buffer<const T>> in, thrust_buffer<T> out, reduce_op op, int root) {
    if (rank() == root) same_size(in.size(), out.size(), "reduce");
    device_block<T> result(in.size());
    allreduce<T>(in, result.span(), op);
    if (rank() == root) {
      mem_.template on_device<T>(out, thrust_buffer<const T>(result.span()));
      mem_.finish();
    }
  }
  template <element T>
  void reduce(thrust_buffer<T> buf, reduce_op op, int root) {
    reduce<T>(thrust_buffer<const T>(buf), buf, op, root);
  }


 private:
  template <class T>
  using host_block_t = detail::staging::memory::host_block<T>;
  template <class T>
  using device_block = detail::staging::memory::device_block<T>;

  // Staging buffers are kept between calls, one per role, as raw bytes sized to the largest use.
  template <class T>
  std::span<T> host_block(int role, std::size_t n) {
    auto& b = staging_[static_cast<std::size_t>(role)];
    if (b.size() < n * sizeof(T)) b = host_block_t<std::byte>(n * sizeof(T));
    return {reinterpret_cast<T*>(b.span().data()), n};
  }
  template <class T>
  std::span<T> stage_out(thrust_buffer<const T> src, int role) {
    std::span<T> h = host_block<T>(role, src.size());
    mem_.template to_host<T>(h, src);
    return h;
  }
  // Stages `in` out, runs `op(host in, host out)`, and stages the result into `out` (if `back`).
  template <class T, class Op>
  void through_host(thrust_buffer<const T> in, thrust_buffer<T> out, bool back, Op&& op) {
    std::span<T> h_in = stage_out<T>(in, 0);
    std::span<T> h_out = host_block<T>(1, back ? out.size() : 0);
    op(std::span<const T>(h_in), h_out);
    if (back) stage_in<T>(out, h_out);
  }
  // Stages `buf` out, runs `op(host copy)` in place, and stages it back.
  template <class T, class Op>
  void in_place_through_host(thrust_buffer<T> buf, Op&& op) {
    std::span<T> h = stage_out<T>(buf, 0);
    op(h);
    stage_in<T>(buf, h);
  }
  template <class T>
  void stage_in(thrust_buffer<T> dst, std::span<T> src) {
    mem_.template to_device<T>(dst, std::span<const T>(src.first(dst.size())));
  }

  // Every rank's block `rank()` (blocks of `block` elements; `in` is padded with zeros to
  // size() blocks), combined on the device in rank order (avg divided there too); returns it
  // staged on the host.
  template <class T>
  std::span<T> reduce_blocks(thrust_buffer<const T> in, std::size_t block, reduce_op op) {
    const std::size_t p = static_cast<std::size_t>(size()), padded = block * p;
    std::span<T> out = host_block<T>(0, padded);
    mem_.template to_host<T>(out.first(in.size()), in);
    std::fill(out.begin() + static_cast<std::ptrdiff_t>(in.size()), out.end(), T{});
    std::span<T> got = host_block<T>(1, padded);  // block q: rank q's block rank()
    host_.alltoall(std::span<const T>(out), got);
    const thrust_buffer<T> dev = device_scratch<T>(padded);
    mem_.template to_device<T>(dev, std::span<const T>(got));
    const auto reduce = mem_.reduction();
    const auto acc = dev.first(block);
    for (std::size_t q = 1; q < p; ++q) reduce(acc, thrust_buffer<const T>(dev.subspan(q * block, block)), op);
    if (op == reduce_op::avg) reduce.finish_average(acc, size());
    std::span<T> mine = host_block<T>(2, block);
    mem_.template to_host<T>(mine, thrust_buffer<const T>(acc));
    return mine;
  }

  Transport& host_transport() noexcept { return host_.transport(); }

  template <class T>
  static thrust_buffer<const std::byte> as_bytes(thrust_buffer<T> b) noexcept {
    return {reinterpret_cast<const std::byte*>(b.data()), b.size_bytes()};
  }

  // A message's request before the transport's part starts: its block, signature and names.
  template <class T>
  p2p_message start_message(int peer, std::uint64_t tag, std::size_t n, bool receive, signature sig) {
    if (tag == host_.options().tag || peer < 0 || peer >= size()) {
      throw error(errc::invalid_argument, std::string("staged ") + (receive ? "irecv" : "isend") + ": peer " +
                                              std::to_string(peer) + " of a group of " + std::to_string(size()) +
                                              ", tag " + std::to_string(tag) + " (" +
                                              std::to_string(host_.options().tag) + " is the collectives')");
    }
    p2p_message r;
    r.state_ = p2p_;
    r.block_ = p2p_->pool->take(n * sizeof(T));
    r.want_ = sig;
    r.want_.type = dtype_of<T>::value;
    r.want_.count = n;
    r.rank_ = rank();
    r.peer_ = peer;
    r.tag_ = tag;
    r.receive_ = receive;
    r.settled_ = false;
    return r;
  }

  template <class T>
  thrust_buffer<T> device_scratch(std::size_t n) {
    if (scratch_.size() < n * sizeof(T)) scratch_ = device_block<std::byte>(n * sizeof(T));
    return {reinterpret_cast<T*>(scratch_.span().data()), n};
  }

  std::size_t blocks_of(std::size_t n) const noexcept {
    const std::size_t p = static_cast<std::size_t>(size());
    return (n + p - 1) / p;
  }
  static void same_size(std::size_t a, std::size_t b, const char* what) {
    if (a != b) {
      throw error(errc::invalid_argument, std::string("staged ") + what + ": buffers of " + std::to_string(a) +
                                              " and " + std::to_string(b) + " elements");
    }
  }

  communicator<Transport> host_;
  detail::staging::memory mem_;
  host_block_t<std::byte> staging_[4];
  device_block<std::byte> scratch_;
  std::shared_ptr<detail::staging::p2p_state> p2p_ = std::make_shared<detail::staging::p2p_state>(
      flight::p2p_log(flight::group_of(host_.transport(), 0), flight::members_of(host_.transport())));
};

}  // namespace dtrain
