#pragma once
/// @file
/// `mixed_request<TcpRequest, ShmRequest>`: the completion handle of a mixed transport's send or
/// receive (a model of `completion`). It holds the one underlying handle of the path the peer
/// takes, or, for a receive from any peer on a host with peers elsewhere too, both twins: the
/// one that completes other than by being dropped is the answer, and the other is cancelled.
/// Envelopes of the shared-memory path are renamed from local to world ranks.

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "dtrain/concepts/completion.hpp"
#include "dtrain/core/deadline.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/detail/request_error.hpp"
#include "dtrain/transport/byte_operation.hpp"

namespace dtrain {

template <class TcpRequest, class ShmRequest>
class mixed_request {
 public:
  mixed_request() = default;
  mixed_request(TcpRequest tcp, bool is_send) : tcp_(std::move(tcp)), send_(is_send) {}
  mixed_request(ShmRequest shm, std::shared_ptr<const std::vector<int>> world, bool is_send)
      : shm_(std::move(shm)), world_(std::move(world)), send_(is_send) {}
  mixed_request(TcpRequest tcp, ShmRequest shm, std::shared_ptr<const std::vector<int>> world)
      : tcp_(std::move(tcp)), shm_(std::move(shm)), world_(std::move(world)) {}

  bool wait(deadline d, std::error_code& ec) noexcept {
    if (!tcp_ || !shm_) return tcp_ ? tcp_->wait(d, ec) : shm_ ? shm_->wait(d, ec) : (ec.clear(), true);
    // Twins: the shared-memory one is waited on in slices (its waits move its bytes), the TCP
    // one is tested between them (its engine moves its own).
    for (;;) {
      if (test()) return winner_ == on_shm ? settle_on_shm(d, ec) : settle_on_tcp(d, ec);
      if (d.expired()) {
        ec = make_error_code(errc::timeout);
        return false;
      }
      std::error_code ignored;
      shm_->wait(std::min(d, deadline::after(std::chrono::microseconds(200))), ignored);
    }
  }

  void wait(deadline d) {
    std::error_code ec;
    if (!wait(d, ec)) {
      throw error(ec, detail::request_error_text(send_, info(), detail()));
    }
  }

  bool test() const noexcept {
    if (!tcp_ || !shm_) return tcp_ ? tcp_->test() : shm_ ? shm_->test() : true;
    // Only the twin that claimed the message completes other than dropped; once one has, the
    // other is cancelled, so the answer is remembered rather than asked again.
    if (winner_ == none && shm_->test() && !dropped(*shm_)) winner_ = on_shm;
    if (winner_ == none && tcp_->test() && !dropped(*tcp_)) winner_ = on_tcp;
    return winner_ != none;
  }

  void cancel() noexcept {
    if (tcp_) tcp_->cancel();
    if (shm_) shm_->cancel();
  }

  const envelope& info() const noexcept {
    const bool from_shm = answered_by_shm();
    env_ = from_shm ? shm_->info() : tcp_ ? tcp_->info() : envelope{};
    if (from_shm && world_ && env_.peer >= 0 && static_cast<std::size_t>(env_.peer) < world_->size()) {
      env_.peer = (*world_)[static_cast<std::size_t>(env_.peer)];
    }
    return env_;
  }

  const std::string& detail() const noexcept {
    static const std::string empty;
    const bool from_shm = answered_by_shm();
    return from_shm ? shm_->detail() : tcp_ ? tcp_->detail() : empty;
  }

 private:
  enum twin { none, on_tcp, on_shm };

  bool answered_by_shm() const noexcept { return shm_ && (!tcp_ || (test() && winner_ == on_shm)); }

  template <class R>
  static bool dropped(const R& r) noexcept {
    return r.detail() == detail::served_by_the_other_transport;
  }

  bool settle_on_shm(deadline d, std::error_code& ec) noexcept {
    tcp_->cancel();
    return shm_->wait(d, ec);
  }
  bool settle_on_tcp(deadline d, std::error_code& ec) noexcept {
    shm_->cancel();
    return tcp_->wait(d, ec);
  }

  std::optional<TcpRequest> tcp_;
  std::optional<ShmRequest> shm_;
  std::shared_ptr<const std::vector<int>> world_;
  bool send_ = false;
  mutable twin winner_ = none;  // of a pair of twins, the one that took the message
  mutable envelope env_;
};

}  // namespace dtrain
