#pragma once
/// @file
/// `detail::engine_handle<Derived, Engine, Request>`: what the TCP and shared-memory transports'
/// handles share. A handle owns its engine together with the requests it hands out (a request
/// keeps the engine alive past a moved-from handle), forwards sends and receives to it, and
/// leaves the group when it is destroyed or assigned over.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/concepts/transport.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/signature.hpp"
#include "dtrain/transport/buffer_forms.hpp"

namespace dtrain::detail {

template <class Derived, class Engine, class Request>
class engine_handle : public transport_buffer_forms<Derived> {
 public:
  using transport_buffer_forms<Derived>::irecv;
  using transport_buffer_forms<Derived>::isend;
  using request = Request;

  engine_handle(engine_handle&&) noexcept = default;
  /// This rank's old endpoint leaves its group, as its destructor would, once `other`'s is taken.
  engine_handle& operator=(engine_handle&& other) noexcept {
    const engine_handle old(std::move(*this));
    engine_ = std::move(other.engine_);
    keepalive_ = std::move(other.keepalive_);
    return *this;
  }
  ~engine_handle() { leave(); }

  int rank() const noexcept { return engine_ ? engine_->rank() : 0; }
  int size() const noexcept { return engine_ ? engine_->size() : 0; }

  /// Starts sending the bytes of `parts` as one message.
  /// @pre 0 <= peer < size(), parts.size() <= max_message_parts
  request isend(int peer, std::uint64_t tag, const signature& sig, gather_list parts) {
    DTRAIN_ASSERT(peer >= 0 && peer < size(), "send to a rank outside the group");
    return {engine_, engine_->send(peer, tag, sig, parts)};
  }

  /// Starts receiving from `peer` (or `any_peer`) on `tag` into `parts`, or whole into
  /// `*overflow` if larger (see the `transport` concept).
  request irecv(int peer, std::uint64_t tag, scatter_list parts, std::vector<std::byte>* overflow) {
    DTRAIN_ASSERT(peer == any_peer || (peer >= 0 && peer < size()), "receive from a rank outside the group");
    return {engine_, engine_->receive(peer, tag, parts, overflow)};
  }

  /// The same receive, posted also in another transport under the shared `claim`: it takes a
  /// message only if its twin has not (the mixed transport's receives from any peer).
  request irecv_claimed(int peer, std::uint64_t tag, scatter_list parts, std::vector<std::byte>* overflow,
                        std::shared_ptr<std::atomic<bool>> claim) {
    return {engine_, engine_->receive(peer, tag, parts, overflow, std::move(claim))};
  }

  /// Whether this host has two cores for each of the group's ranks on it: then waits under
  /// `default_progress` spin before they block (progress.hpp).
  bool spare_cores() const noexcept { return engine_ && engine_->spare_cores(); }

  /// Why the group failed (which rank was lost, and how); empty while it is healthy.
  std::string failure() const { return engine_ ? engine_->failure() : std::string(); }

  /// Fails the group on every rank, telling each peer `why` (what this rank found, such as a
  /// collective mismatch naming both calls): their waiting operations fail with `code` and `why`,
  /// where they would otherwise only see this rank leave (`peer_lost`). Used by the
  /// communicators; the group is then done.
  void abort(const std::string& why, errc code = errc::peer_lost) noexcept {
    if (engine_) engine_->abort(why, code);
  }

  /// Leaves the group now (the destructor does this too): what was sent is delivered first.
  void leave() noexcept {
    if (engine_) engine_->stop();
    engine_.reset();
    keepalive_.reset();
  }

 protected:
  explicit engine_handle(std::shared_ptr<Engine> e) : engine_(std::move(e)) {}

  std::shared_ptr<Engine> engine_;
  std::shared_ptr<void> keepalive_;  // the store server rank 0 hosts for the group's lifetime
};

}  // namespace dtrain::detail
