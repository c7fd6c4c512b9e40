#pragma once
/// @file
/// `nccl_communicator`'s point-to-point messages: the engine that matches them on their lanes
/// (collective/nccl_lanes.hpp) and the request `isend` and `irecv` return. Included by
/// collective/nccl.hpp (use that).
///
/// A message is a header (tag, signature) and its payload, both on the lane from its sender to
/// its receiver. The receiver keeps one header receive posted while receives wait. When a
/// header lands, its payload goes to the first receive waiting for its tag, once that receive's
/// type and count are checked (a mismatch drains the payload into scratch, so the lane stays in
/// step, and fails the receive), or into scratch for a receive posted later: tags need not be
/// received in the order they were sent. Messages progress whenever any request of the
/// communicator is tested or waited for.

#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>

#include "dtrain/collective/nccl_lanes.hpp"
#include "dtrain/concepts/completion.hpp"
#include "dtrain/concepts/element.hpp"
#include "dtrain/core/deadline.hpp"
#include "dtrain/core/element.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/memory_space.hpp"
#include "dtrain/core/signature.hpp"
#include "dtrain/cuda/runtime.hpp"
#include "dtrain/flight/recorded.hpp"

namespace dtrain {

namespace detail::nccl {

class p2p_engine {
 public:
  /// Forms this rank's lanes, collective over `parent`. @throws dtrain::error
  p2p_engine(ncclComm_t parent, int rank, int size, int device, std::chrono::milliseconds timeout, deadline d,
             flight::p2p_log log)
      : rank_(rank), device_(device), timeout_(timeout), log_(std::move(log)) {
    form_lanes(parent, rank, size, d, out_, in_);
  }

  p2p_engine(const p2p_engine&) = delete;
  p2p_engine& operator=(const p2p_engine&) = delete;
  ~p2p_engine() {
    try {
      const on_device here(device_);  // the lanes' streams and events are its
      out_.clear(), in_.clear();
    } catch (...) {  // the members' destructors free what is left
    }
  }

  int rank() const noexcept { return rank_; }
  /// The flight recorder's record of this rank's messages.
  flight::p2p_log& log() noexcept { return log_; }

  std::shared_ptr<p2p_op> send(int peer, std::uint64_t tag, const std::byte* data, const signature& sig) {
    std::lock_guard lock(m_);
    const on_device here(device_);
    return guarded([&] { return send_locked(peer, tag, data, sig); });
  }

  std::shared_ptr<p2p_op> receive(int peer, std::uint64_t tag, std::byte* data, const signature& want) {
    std::lock_guard lock(m_);
    const on_device here(device_);
    return guarded([&] { return receive_locked(peer, tag, data, want); });
  }

  /// Moves every lane's messages on; @returns whether `op` has finished, with `ec` its result.
  bool poll(p2p_op& op, std::error_code& ec) noexcept {
    std::lock_guard lock(m_);
    try {
      const on_device here(device_);
      if (!failure_.empty() && op.at != p2p_op::phase::finished) finish(op, make_error_code(errc::broken));
      for (lane& in : in_) progress(in);
      lane& mine = (op.receive ? in_ : out_)[static_cast<std::size_t>(op.peer)];
      if (mine.comm != nullptr) {
        ncclResult_t state = ncclSuccess;
        if (ncclCommGetAsyncError(mine.comm, &state) != ncclSuccess ||
            (state != ncclSuccess && state != ncclInProgress)) {
          throw error(errc::device_error, "nccl: the lane with rank " + std::to_string(op.peer) + " failed: " +
                                              text(state) + " (a peer failed or was lost)");
        }
      }
      if (op.at == p2p_op::phase::enqueued && op.done.ready()) op.at = p2p_op::phase::finished;
    } catch (const error& e) {
      fail_all(e.code(), e.what());
    } catch (const std::exception& e) {
      fail_all(make_error_code(errc::device_error), e.what());
    }
    if (op.at != p2p_op::phase::finished) return false;
    ec = op.result;
    return true;
  }

  /// Withdraws a receive still waiting for its message; an operation already on its lane is
  /// waited for (its buffer is in use on the GPU) under the communicator's timeout, after which
  /// every lane is aborted.
  void withdraw(p2p_op& op) noexcept {
    {
      std::lock_guard lock(m_);
      if (op.at == p2p_op::phase::waiting) {
        auto& waiting = in_[static_cast<std::size_t>(op.peer)].waiting;
        std::erase_if(waiting, [&](const std::shared_ptr<p2p_op>& w) { return w.get() == &op; });
        finish(op, make_error_code(errc::cancelled));
        return;
      }
    }
    std::error_code ec;
    const deadline d = deadline::after(timeout_);
    while (!poll(op, ec)) {
      if (d.expired()) {
        std::lock_guard lock(m_);
        fail_all(make_error_code(errc::cancelled), "nccl: a cancelled operation with rank " + std::to_string(op.peer) +
                                                       " did not finish within the deadline; lanes aborted");
        return;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  /// Why the lanes were aborted; empty while they are healthy.
  std::string failure() const {
    std::lock_guard lock(m_);
    return failure_;
  }

 private:
  // Runs a send's or receive's enqueueing: a failure halfway leaves a lane out of step, so it
  // aborts every lane before it reaches the caller.
  template <class F>
  std::shared_ptr<p2p_op> guarded(F&& f) {
    try {
      return f();
    } catch (const error& e) {
      fail_all(e.code(), e.what());
      throw;
    }
  }

  std::shared_ptr<p2p_op> send_locked(int peer, std::uint64_t tag, const std::byte* data, const signature& sig) {
    auto op = post(false, peer, tag, sig);
    const std::size_t bytes = payload_bytes(sig);
    if (peer == rank_) {  // to itself: a copy, into the receive waiting for it or into scratch
      lane& self = in_[static_cast<std::size_t>(peer)];
      op->posted.make_wait(self.stream.get());
      land(self, {tag, sig}, [&](void* dst) { copy(dst, data, bytes, self.stream.get()); });
      enqueued(*op, self);
      return op;
    }
    lane& out = out_[static_cast<std::size_t>(peer)];
    op->posted.make_wait(out.stream.get());
    lane::slot& s = free_slot(out);
    s.host.data()[0] = p2p_header{tag, sig};
    cuda::check(cudaMemcpyAsync(s.device.data(), s.host.data(), sizeof(p2p_header), cudaMemcpyHostToDevice,
                                out.stream.get()),
                "cudaMemcpyAsync");
    enqueue(out, ncclSend(s.device.data(), sizeof(p2p_header), ncclUint8, lane_receiver, out.comm, out.stream.get()));
    if (bytes > 0) enqueue(out, ncclSend(data, bytes, ncclUint8, lane_receiver, out.comm, out.stream.get()));
    s.user = op;
    enqueued(*op, out);
    return op;
  }

  std::shared_ptr<p2p_op> receive_locked(int peer, std::uint64_t tag, std::byte* data, const signature& want) {
    auto op = post(true, peer, tag, want);
    op->data = data;
    lane& in = in_[static_cast<std::size_t>(peer)];
    progress(in);
    const auto early = std::find_if(in.early.begin(), in.early.end(), [&](const early_message& m) {
      return m.header.tag == tag;
    });
    if (early == in.early.end()) {
      in.waiting.push_back(op);
      if (peer != rank_ && !in.header_posted) post_header(in);
      return op;
    }
    const early_message m = *early;
    in.early.erase(early);
    if (accepts(*op, m.header.sig)) {
      op->posted.make_wait(in.stream.get());
      copy(op->data, m.scratch, payload_bytes(m.header.sig), in.stream.get());
      enqueued(*op, in);
    }
    release_on(m.scratch, in.stream.get());
    return op;
  }

  std::shared_ptr<p2p_op> post(bool receive, int peer, std::uint64_t tag, const signature& sig) {
    if (!failure_.empty()) throw error(errc::broken, "nccl: point-to-point lanes were aborted: " + failure_);
    auto op = std::make_shared<p2p_op>();
    op->receive = receive, op->peer = peer, op->tag = tag, op->want = sig;
    op->posted.record(cudaStreamLegacy);  // the caller's stream-0 work on the buffer comes first
    return op;
  }

  static std::size_t payload_bytes(const signature& s) { return s.count * dtype_size(s.type); }

  static void copy(void* dst, const void* src, std::size_t bytes, cudaStream_t s) {
    if (bytes > 0) cuda::check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
  }

  void enqueue(lane& l, ncclResult_t r) {
    if (r != ncclSuccess && r != ncclInProgress) throw error(errc::device_error, "nccl: point-to-point: " + text(r));
    if (r == ncclInProgress) settle_lane(l.comm, deadline::after(timeout_), "point-to-point");
  }

  static void enqueued(p2p_op& op, lane& l) {
    op.done.record(l.stream.get());
    op.at = p2p_op::phase::enqueued;
  }

  static void finish(p2p_op& op, std::error_code ec) noexcept {
    op.at = p2p_op::phase::finished;
    op.result = ec;
  }

  // Records what a receive's sender sent; a type or count other than expected finishes it.
  static bool accepts(p2p_op& op, const signature& got) noexcept {
    op.got = got;
    if (got.type == op.want.type && got.count == op.want.count) return true;
    finish(op, make_error_code(errc::collective_mismatch));
    return false;
  }

  lane::slot& free_slot(lane& out) {
    for (auto& s : out.slots) {
      if (!s.user || s.user->at == p2p_op::phase::finished || s.user->done.ready()) return s;
    }
    return out.slots.emplace_back();
  }

  void post_header(lane& in) {
    const cudaStream_t s = in.stream.get();
    enqueue(in, ncclRecv(in.header_device.data(), sizeof(p2p_header), ncclUint8, lane_sender, in.comm, s));
    cuda::check(cudaMemcpyAsync(in.header_host.data(), in.header_device.data(), sizeof(p2p_header),
                                cudaMemcpyDeviceToHost, s),
                "cudaMemcpyAsync");
    in.header_landed.record(s);
    in.header_posted = true;
  }

  // Takes the header that landed on `in`, if one did, and receives its payload.
  void progress(lane& in) {
    while (in.header_posted && in.header_landed.ready()) {
      in.header_posted = false;
      const p2p_header h = in.header_host.data()[0];
      if (h.sig.type > last_dtype || h.sig.count > (std::uint64_t{1} << 48)) {
        throw error(errc::protocol_error, "nccl: a malformed point-to-point header (type " +
                                              std::to_string(static_cast<int>(h.sig.type)) + ", count " +
                                              std::to_string(h.sig.count) + ")");
      }
      const std::size_t bytes = payload_bytes(h.sig);
      land(in, h, [&](void* dst) {
        if (bytes > 0) enqueue(in, ncclRecv(dst, bytes, ncclUint8, lane_sender, in.comm, in.stream.get()));
      });
      if (!in.waiting.empty()) post_header(in);
    }
  }

  // A message whose header is known: its payload to the first receive waiting for its tag, else
  // into scratch. `receive(dst)` enqueues the payload's copy into `dst` on the lane's stream.
  template <class Receive>
  void land(lane& in, const p2p_header& h, Receive&& receive) {
    const std::size_t bytes = payload_bytes(h.sig);
    const cudaStream_t s = in.stream.get();
    const auto it = std::find_if(in.waiting.begin(), in.waiting.end(), [&](const auto& w) { return w->tag == h.tag; });
    if (it == in.waiting.end()) {
      void* scratch = allocate_on(s, bytes);
      in.early.push_back({h, scratch});
      receive(scratch);
      return;
    }
    const std::shared_ptr<p2p_op> op = *it;
    in.waiting.erase(it);
    if (!accepts(*op, h.sig)) {
      void* drain = allocate_on(s, bytes);
      receive(drain);
      release_on(drain, s);
      return;
    }
    op->posted.make_wait(s);
    receive(op->data);
    enqueued(*op, in);
  }

  // Aborts every lane and finishes every operation waiting: nothing more moves on them.
  void fail_all(std::error_code ec, const std::string& why) noexcept {
    if (failure_.empty()) failure_ = why;
    for (auto* lanes : {&in_, &out_}) {
      for (lane& l : *lanes) {
        if (l.comm != nullptr) ncclCommAbort(std::exchange(l.comm, nullptr));
        l.header_posted = false;
        for (auto& w : l.waiting) finish(*w, ec);
        l.waiting.clear();
        for (auto& s : l.slots) {
          if (s.user && s.user->at != p2p_op::phase::finished) finish(*s.user, ec);
        }
      }
    }
  }

  mutable std::mutex m_;
  int rank_ = 0, device_ = 0;
  std::chrono::milliseconds timeout_;
  std::deque<lane> out_, in_;  // by peer; in_[rank_] is the lane of messages to itself
  std::string failure_;
  flight::p2p_log log_;
};

}  // namespace detail::nccl

/// A point-to-point send or receive of `nccl_communicator` (a `completion`). A receive's bytes
/// are in its buffer once `wait` succeeds or `test` returns true. A `wait` that times out leaves
/// the operation pending (a later `wait` may succeed). Cancelling (or destroying) a receive that
/// has not matched withdraws it; an operation already on the GPU is waited for first, under the
/// communicator's timeout. Finished or destroyed before its communicator.
class nccl_p2p_request {
 public:
  nccl_p2p_request() = default;
  nccl_p2p_request(nccl_p2p_request&& o) noexcept { *this = std::move(o); }
  /// A moved-from handle is finished and empty, as a default-constructed one.
  nccl_p2p_request& operator=(nccl_p2p_request&& o) noexcept {
    if (this == &o) return *this;
    cancel();
    engine_ = std::exchange(o.engine_, nullptr);
    op_ = std::move(o.op_);
    info_ = o.info_;
    return *this;
  }
  ~nccl_p2p_request() { cancel(); }

  bool wait(deadline d, std::error_code& ec) noexcept {
    const auto spin_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(2);
    while (!test(ec)) {
      if (d.expired()) {
        ec = make_error_code(errc::timeout);
        return false;  // still pending: a later wait may succeed
      }
      if (std::chrono::steady_clock::now() > spin_until) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    return !ec;
  }

  /// @throws dtrain::error naming this rank, the peer and the tag; for a receive of the wrong
  ///   type or size, what was expected and what the sender sent.
  void wait(deadline d) {
    std::error_code ec;
    if (wait(d, ec)) return;
    std::string text = std::string("nccl ") + (op_->receive ? "receive from" : "send to") + " rank " +
                       std::to_string(op_->peer) + " (tag " + std::to_string(op_->tag) + ") at rank " +
                       std::to_string(engine_->rank());
    if (ec == errc::collective_mismatch) {
      text += ": expected " + describe_message(op_->want) + ", the sender sent " + describe_message(op_->got);
    } else if (ec == errc::broken || ec == errc::device_error) {
      text += ": " + engine_->failure();
    }
    throw error(ec, text);
  }

  bool test() noexcept {
    std::error_code ec;
    return test(ec);
  }

  void cancel() noexcept {
    if (op_) engine_->withdraw(*op_);
  }

  const envelope& info() const noexcept { return info_; }

 private:
  template <class>
  friend class nccl_p2p_forms;
  nccl_p2p_request(detail::nccl::p2p_engine& engine, std::shared_ptr<detail::nccl::p2p_op> op)
      : engine_(&engine), op_(std::move(op)) {
    info_.peer = op_->peer, info_.tag = op_->tag;
  }

  bool test(std::error_code& ec) noexcept {
    ec = {};
    if (!op_) return true;
    if (!engine_->poll(*op_, ec)) return false;
    info_.sig = op_->receive ? op_->got : op_->want;
    info_.bytes = info_.sig.count * dtype_size(info_.sig.type);
    return true;
  }

  static std::string describe_message(const signature& s) {
    return std::to_string(s.count) + " " + std::string(dtype_name(s.type));
  }

  detail::nccl::p2p_engine* engine_ = nullptr;
  std::shared_ptr<detail::nccl::p2p_op> op_;
  envelope info_{};
};

/// `nccl_communicator`'s point-to-point operations, over its `lanes(what, peer)` (the engine,
/// once the peer is checked) and `options()`.
template <class Communicator>
class nccl_p2p_forms {
 public:
  /// What `isend` and `irecv` return: an `nccl_p2p_request` with its flight record.
  using p2p_request = flight::recorded<nccl_p2p_request>;

  /// Starts sending `buf` to `peer` on `tag`; never waits for the peer. `buf` is read on the GPU
  /// until the request finishes. `sig`, if given, travels with the message (its type and count
  /// are `buf`'s), for a caller that checks more (a pipeline's micro-batch) in `info().sig`.
  template <class T>
    requires element<std::remove_const_t<T>>
  p2p_request isend(int peer, std::uint64_t tag, device_span<T> buf, signature sig = {}) {
    sig.type = dtype_of<std::remove_const_t<T>>::value, sig.count = buf.size();
    auto& engine = self().lanes("isend", peer);
    nccl_p2p_request r(engine, engine.send(peer, tag, reinterpret_cast<const std::byte*>(buf.data()), sig));
    return engine.log().post(std::move(r), peer, tag, true, sig);
  }
  /// Starts receiving `buf.size()` elements from `peer` on `tag` into `buf`. A message of another
  /// type or size fails it with `errc::collective_mismatch`, naming both.
  template <element T>
  p2p_request irecv(int peer, std::uint64_t tag, device_span<T> buf) {
    signature want;
    want.type = dtype_of<T>::value, want.count = buf.size();
    auto& engine = self().lanes("irecv", peer);
    nccl_p2p_request r(engine, engine.receive(peer, tag, reinterpret_cast<std::byte*>(buf.data()), want));
    return engine.log().post(std::move(r), peer, tag, false, want);
  }
  /// `isend` waited for under the communicator's timeout.
  template <class T>
    requires element<std::remove_const_t<T>>
  void send(int peer, std::uint64_t tag, device_span<T> buf) {
    isend(peer, tag, buf).wait(deadline::after(self().options().timeout));
  }
  /// `irecv` waited for under the communicator's timeout.
  template <element T>
  void recv(int peer, std::uint64_t tag, device_span<T> buf) {
    irecv(peer, tag, buf).wait(deadline::after(self().options().timeout));
  }

 private:
  Communicator& self() noexcept { return static_cast<Communicator&>(*this); }
};

}  // namespace dtrain
