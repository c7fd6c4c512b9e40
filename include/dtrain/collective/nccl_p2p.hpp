#pragma once
/// @file
/// `nccl_communicator`'s point-to-point messages: the request `isend` and `irecv` return, and
/// the operations themselves (`nccl_p2p_forms`, a base of `nccl_communicator`), over the engine
/// of collective/nccl_p2p_engine.hpp. Included by collective/nccl.hpp (use that).
///
/// Messages move on whenever any request of the communicator is tested or waited for; a receive's
/// header is received only while it (or another receive from its peer) is waited for.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>

#include "dtrain/collective/nccl_p2p_engine.hpp"
#include "dtrain/concepts/completion.hpp"
#include "dtrain/concepts/element.hpp"
#include "dtrain/core/deadline.hpp"
#include "dtrain/core/element.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/memory_space.hpp"
#include "dtrain/core/signature.hpp"
#include "dtrain/flight/recorded.hpp"

namespace dtrain {

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
    finished_ = std::exchange(o.finished_, true);
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

  /// A finished one touches nothing: it may be destroyed after its communicator.
  void cancel() noexcept {
    if (op_ && !finished_) engine_->withdraw(*op_);
    finished_ = true;
  }

  const envelope& info() const noexcept { return info_; }

 private:
  template <class>
  friend class nccl_p2p_forms;
  nccl_p2p_request(detail::nccl::p2p_engine& engine, std::shared_ptr<detail::nccl::p2p_op> op)
      : engine_(&engine), op_(std::move(op)), finished_(false) {
    info_.peer = op_->peer, info_.tag = op_->tag;
  }

  bool test(std::error_code& ec) noexcept {
    ec = {};
    if (!op_) return true;
    if (finished_) {
      ec = op_->result;
    } else if (!engine_->poll(*op_, ec)) {
      return false;
    }
    finished_ = true;
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
  bool finished_ = true;  // a default or moved-from handle is finished
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
