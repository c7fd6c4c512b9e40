#pragma once
/// @file
/// `transport_request<Owner, Operation, Progress>`: the completion handle of one send or receive (a model
/// of `completion`), for every transport. A handle shares ownership of what runs the operation
/// (the in-process fabric, the TCP engine), so a handle outliving its transport is safe, and it
/// withdraws an unfinished operation when it is destroyed or overwritten.
///
/// An `Operation` has `completion_flag flag`, `std::error_code ec` and `std::string detail` (both
/// written before the flag is set), `is_send` and `env`. `Owner` provides, for a
/// `std::shared_ptr<Operation>`, `wait(op, deadline, spin)`: whether it finished by the deadline,
/// and `cancel(op)`; and may provide `spare_cores()` (progress.hpp). `Progress` says how long a
/// waiter spins before it blocks.

#include <chrono>
#include <memory>
#include <string>
#include <system_error>
#include <utility>

#include "dtrain/core/deadline.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/signature.hpp"
#include "dtrain/detail/request_error.hpp"
#include "dtrain/transport/progress.hpp"

namespace dtrain {

template <class Owner, class Operation, class Progress = blocking>
class transport_request {
 public:
  using op_ptr = std::shared_ptr<Operation>;

  transport_request() = default;
  transport_request(std::shared_ptr<Owner> owner, op_ptr op) : owner_(std::move(owner)), op_(std::move(op)) {}
  transport_request(transport_request&&) noexcept = default;
  transport_request& operator=(transport_request&& other) noexcept {
    if (this != &other) {
      cancel();
      owner_ = std::move(other.owner_);
      op_ = std::move(other.op_);
    }
    return *this;
  }
  ~transport_request() { cancel(); }

  /// Waits until the operation completes or `d` passes. @returns true on success.
  bool wait(deadline d, std::error_code& ec) noexcept {
    if (!op_) {
      ec.clear();
      return true;
    }
    bool spare = false;  // an owner that cannot tell has no cores to spare
    if constexpr (requires { owner_->spare_cores(); }) spare = owner_->spare_cores();
    if (!owner_->wait(op_, d, detail::spin_for<Progress>(spare))) {
      ec = make_error_code(errc::timeout);
      return false;
    }
    ec = op_->ec;
    return !ec;
  }

  /// Throwing form of `wait`. @throws dtrain::error naming the operation, the peer, the tag and
  /// (after a failure) what went wrong, e.g. on the wire.
  void wait(deadline d) {
    std::error_code ec;
    if (!wait(d, ec)) throw error(ec, detail::request_error_text(op_->is_send, op_->env, detail()));
  }

  /// @returns true once the operation has finished, successfully or not.
  bool test() const noexcept { return !op_ || op_->flag.done(); }

  /// Withdraws the operation if its bytes have not started moving; otherwise lets it finish
  /// (over TCP bounded by the linger time, after which its connection is closed). Afterwards its
  /// buffer is not referenced.
  void cancel() noexcept {
    if (op_ && !test()) owner_->cancel(op_);
  }

  /// The operation's envelope (sender, tag, signature; a receive's size once it completed).
  const envelope& info() const noexcept {
    static const envelope empty{};
    return op_ ? op_->env : empty;
  }

  /// Why the operation failed, in words (which peer was lost and how); empty on success.
  const std::string& detail() const noexcept {
    static const std::string none;
    return op_ && op_->flag.done() ? op_->detail : none;
  }

 private:
  std::shared_ptr<Owner> owner_;
  op_ptr op_;
};

}  // namespace dtrain
