#pragma once
/// @file
/// `ps::replica_membership<Replica>`: how one copy of a shard (ps/shard_replica.hpp, a CRTP part
/// of it) follows its chain's membership: it takes the shard over when the heads before it are
/// lost, lets a joining server in and sends it the shard's state, installs the state it is sent
/// when it is the joiner, and tells its chain of a loss.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/ps/protocol.hpp"
#include "dtrain/ps/shard_transfer.hpp"
#include "dtrain/ps/worker_clocks.hpp"

namespace dtrain::ps {

template <class Replica>
class replica_membership {
 public:
  /// This copy heads the shard now (the heads before it are lost). Every worker starts at the
  /// rounds this copy holds under a barrier model (their pushes of the interrupted round come
  /// again), else at `clocks` (the server's own shard's view; a worker's clock request corrects
  /// it); `liveness` says which workers have left or were dropped.
  void take_over(const std::vector<std::int64_t>& clocks, const worker_clocks& liveness) {
    Replica& r = self();
    r.heading_ = true;
    r.taken_over_ = true;
    std::vector<std::int64_t> start(clocks.size(), r.chain().rounds_applied());
    r.workers_.restore(r.consistency_.staleness_bound() == 0 ? start : clocks);
    for (std::size_t w = 0; w < liveness.workers(); ++w) {
      if (r.workers_.absent(w) && !liveness.absent(w)) r.workers_.arrive(w, r.workers_.clock_of(w));
      r.workers_.greeted(w);
      if (liveness.has_finished(w)) r.workers_.finished(w);
      if (liveness.dead(w)) r.workers_.drop(w);
    }
    r.checkpoints_.start_after(r.workers_.slowest());
    r.progress();
  }

  /// Server `from` asks to join the chain (this copy heads it): it becomes the tail once it
  /// holds the state the copy before it sends.
  void on_join(int from) {
    if (self().chain().add_member(self().ctx_->transport, from)) send_state(from);
  }

  /// This copy was just created on a server joining the chain: it installs the state server
  /// `from` sent (`payload`) and becomes the chain's tail.
  /// @throws dtrain::error `bad_data` when the state is malformed
  void install(int from, std::span<const std::byte> payload) {
    Replica& r = self();
    const chain_position at =
        read_shard_state(payload, r.updates_.sparse(), r.updates_.dense(), "server " + std::to_string(from));
    r.updates_.set_version(at.version);
    r.heading_ = false;
    r.chain().joined(r.ctx_->transport, at.sequence, at.joined, at.rounds, at.last_push);
  }

  /// The chain lost a server (after `take_over`, when this copy heads it now).
  void chain_changed() {
    Replica& r = self();
    r.chain().chain_changed(r.ctx_->transport, [&r](int to, message m) { r.ctx_->send_now(to, std::move(m)); },
                            [this](int to) { send_state(to); });
  }

 protected:
  // Sends a server joining the chain this shard's state, as of the last update this copy holds.
  void send_state(int to) {
    Replica& r = self();
    const chain_position at{r.chain().sequence(), r.updates_.version(), r.chain().rounds_applied(),
                            r.ctx_->layout.joined(r.shard_), r.chain().last_pushes()};
    r.chain().send_state(r.ctx_->transport, to, write_shard_state(at, r.updates_.sparse(), r.updates_.dense()));
  }

 private:
  Replica& self() noexcept { return static_cast<Replica&>(*this); }
};

}  // namespace dtrain::ps
