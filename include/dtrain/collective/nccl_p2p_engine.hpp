#pragma once
/// @file
/// The engine behind `nccl_communicator`'s point-to-point messages (collective/nccl_p2p.hpp):
/// it posts them on their lanes (collective/nccl_lanes.hpp) and matches them. Included by
/// collective/nccl_p2p.hpp (use collective/nccl.hpp).
///
/// A message is a header (tag, signature) and its payload, both on the lane from its sender to
/// its receiver. A header receive is posted while a receive of its lane is waited for. When a
/// header lands, its payload goes to the first receive waiting for its tag, once that receive's
/// type and count are checked (a mismatch drains the payload into scratch, so the lane stays in
/// step, and fails the receive), or into scratch for a receive posted later: tags need not be
/// received in the order they were sent.

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
#include <utility>

#include "dtrain/collective/nccl_lanes.hpp"
#include "dtrain/core/deadline.hpp"
#include "dtrain/core/element.hpp"
#include "dtrain/core/error.hpp"
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
      const cuda::on_device here(device_);  // the lanes' streams and events are its
      abort_lanes(in_, out_);           // a header receive may still wait for a message
      out_.clear(), in_.clear();
    } catch (...) {  // the members' destructors free what is left
    }
  }

  int rank() const noexcept { return rank_; }
  /// The flight recorder's record of this rank's messages.
  flight::p2p_log& log() noexcept { return log_; }

  std::shared_ptr<p2p_op> send(int peer, std::uint64_t tag, const std::byte* data, const signature& sig) {
    std::lock_guard lock(m_);
    const cuda::on_device here(device_);
    return guarded([&] { return send_locked(peer, tag, data, sig); });
  }

  std::shared_ptr<p2p_op> receive(int peer, std::uint64_t tag, std::byte* data, const signature& want) {
    std::lock_guard lock(m_);
    const cuda::on_device here(device_);
    return guarded([&] { return receive_locked(peer, tag, data, want); });
  }

  /// Moves every lane's messages on; @returns whether `op` has finished, with `ec` its result.
  bool poll(p2p_op& op, std::error_code& ec) noexcept {
    std::lock_guard lock(m_);
    try {
      const cuda::on_device here(device_);
      if (!failure_.empty() && op.at != p2p_op::phase::finished) finish(op, make_error_code(errc::broken));
      for (lane& in : in_) progress(in);
      lane& mine = (op.receive ? in_ : out_)[static_cast<std::size_t>(op.peer)];
      // A header receive is posted only while a receive of the lane is waited for: a kernel that
      // waits on the GPU for a message holds up every call that synchronises the device.
      if (op.receive && op.at == p2p_op::phase::waiting && mine.comm != nullptr && !mine.header_posted) {
        post_header(mine);
        progress(mine);
      }
      if (mine.comm != nullptr && op.at != p2p_op::phase::finished) {
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
        if (op.at != p2p_op::phase::finished) finish(op, make_error_code(errc::cancelled));
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
    } catch (const std::exception& e) {
      fail_all(make_error_code(errc::device_error), e.what());
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
      enqueued(*op, self.stream.get());
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
    enqueued(*op, out.stream.get());
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
      in.waiting.push_back(op);  // its header is received when it is waited for (`poll`)
      return op;
    }
    const early_message m = *early;
    in.early.erase(early);
    // On the lane's copy stream: its own stream may hold a header receive for a later message.
    const cudaStream_t s = in.copies.get();
    m.landed->make_wait(s);
    if (accepts(*op, m.header.sig)) {
      op->posted.make_wait(s);
      copy(op->data, m.scratch, payload_bytes(m.header.sig), s);
      enqueued(*op, s);
    }
    release_on(m.scratch, s);
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

  // `op` is on stream `s` now: done once what `s` holds is.
  static void enqueued(p2p_op& op, cudaStream_t s) {
    op.done.record(s);
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
      in.early.push_back({h, scratch, std::make_shared<cuda::event>()});
      receive(scratch);
      in.early.back().landed->record(s);
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
    enqueued(*op, s);
  }

  // Aborts every lane and finishes every operation waiting: nothing more moves on them.
  void fail_all(std::error_code ec, const std::string& why) noexcept {
    if (failure_.empty()) failure_ = why;
    abort_lanes(in_, out_);
    for (auto* lanes : {&in_, &out_}) {
      for (lane& l : *lanes) {
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

}  // namespace dtrain
