#pragma once
/// @file
/// `ps::chain_membership<Chain>`: how one server's side of a shard's chain (ps/replication.hpp's
/// `shard_chain`, a CRTP part of it) changes with the chain's members. A server joins as the new
/// tail: the head sends a membership update down the chain, numbered like an update, and the
/// copy that was the tail sends the joiner the shard's state as of that update (`add_member`,
/// `send_state`, `joined`, `state_again`). A server lost: the next copy heads and numbers on
/// from what it applied, the head sends what the tail has not acknowledged to its new
/// successor, and a new tail acknowledges what it holds (`chain_changed`).

#include <algorithm>
#include <cstdint>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include "dtrain/ps/protocol.hpp"

namespace dtrain::ps {

template <class Chain>
class chain_membership {
 public:
  /// Adds server `joiner` to the chain as its tail, in order with the updates: the membership
  /// update goes down the chain with the next sequence number, and the copy just before the
  /// joiner sends it the state instead. A joiner that asks again (the copy that was to send the
  /// state was lost first) gets a new membership update, and so a state from the copy before
  /// it now. @returns true when that copy is this head: the caller sends the state itself.
  template <class Transport>
  bool add_member(Transport& t, int joiner) {
    Chain& c = self();
    if (c.layout_->gone(c.shard_, joiner)) return false;
    c.layout_->join(c.shard_, joiner);
    const int next = c.layout_->successor(c.shard_, c.me_);
    if (!c.holding()) c.last_progress_ = Chain::clock::now();
    ++c.forwarded_;  // replies wait until the joiner acknowledges it, holding the state
    if (next == joiner) return true;
    auto& o = c.unacked_.emplace_back();
    o.sequence = c.forwarded_;
    o.joiner = joiner;
    request_header h{op::replicate, table_id::sparse, c.forwarded_, 0, 0, 0, 0, static_cast<std::uint32_t>(joiner)};
    h.shard = static_cast<std::uint32_t>(c.shard_);
    h.flags = membership;
    encode_request_header(h, 0, std::span(o.header));
    c.start(t, next, o);
    return false;
  }

  /// Sends the joiner `to` the shard's state (`payload`, as of `sequence()`), before anything
  /// else this server passes on to it.
  template <class Transport>
  void send_state(Transport& t, int to, std::vector<std::byte> payload) {
    Chain& c = self();
    auto& o = c.relays_.emplace_back();
    request_header h{op::state, table_id::sparse, c.sequence(), 0, 0, 0, 0, 0};
    h.shard = static_cast<std::uint32_t>(c.shard_);
    encode_request_header(h, 0, std::span(o.header));
    o.frame = std::move(payload);
    o.value_bytes = std::span<const std::byte>(o.frame);
    c.start(t, to, o);
  }

  /// A state for the shard this server joined already, sent again after a loss (by a copy
  /// that could not know the first one arrived): one this copy has everything of is ignored,
  /// the next update's is taken as that update; a later one must replace this copy.
  enum class again { ignored, taken, reinstall };
  template <class Transport>
  again state_again(Transport& t, std::uint64_t sequence) {
    Chain& c = self();
    if (sequence <= c.applied_) return again::ignored;
    if (sequence > c.applied_ + 1) return again::reinstall;
    c.applied_ = sequence;
    if (c.layout_->successor(c.shard_, c.me_) < 0) c.acknowledge(t, c.applied_);
    return again::taken;
  }

  /// This server joined the chain with the state of update `sequence` (the members that
  /// joined before it, and the rounds and pushes it holds, came with it): it is the tail now
  /// and acknowledges that update to the head.
  template <class Transport>
  void joined(Transport& t, std::uint64_t sequence, const std::vector<int>& joined_before, std::int64_t rounds,
              std::map<std::uint32_t, std::uint64_t> last_push) {
    Chain& c = self();
    for (int s : joined_before) c.layout_->join(c.shard_, s);
    c.layout_->join(c.shard_, c.me_);
    c.applied_ = sequence;
    c.rounds_applied_ = rounds;
    c.last_push_ = std::move(last_push);
    if (c.layout_->successor(c.shard_, c.me_) < 0 && c.layout_->head(c.shard_) >= 0) c.acknowledge(t, c.applied_);
  }

  /// The chain lost a server: a new head numbers on from what it applied as a copy; the head
  /// sends every update the tail has not acknowledged down the chain again (whichever member
  /// was lost, updates it had not passed on are then passed on; a copy that has one passes it
  /// on without applying it); a new tail acknowledges what it holds (an acknowledgement the lost
  /// one owed may never come).
  template <class Transport, class SendReply, class SendState>
  void chain_changed(Transport& t, SendReply&& send_reply, SendState&& send_state) {
    Chain& c = self();
    if (!c.replicating()) return;
    const int next = c.layout_->successor(c.shard_, c.me_);
    if (c.heads() && !c.was_head_) {
      c.was_head_ = true;
      c.forwarded_ = c.applied_;
      c.acked_ = next < 0 ? c.forwarded_ : 0;  // until the tail says what it holds
      c.last_progress_ = Chain::clock::now();
    }
    if (c.heads()) {
      if (next < 0) {
        c.acked_ = c.forwarded_;
        c.unacked_.clear();
      } else if (c.layout_->chain(c.shard_) != c.seen_) {
        // A joiner whose state the lost copy owed it gets this head's, which holds everything.
        const bool owes_state = std::any_of(c.unacked_.begin(), c.unacked_.end(), [&](const auto& o) {
          return o.joiner == next && o.sequence > c.acked_;
        });
        if (owes_state) {
          send_state(next);
        } else {
          for (auto& o : c.unacked_) {  // in order; the new successor skips what it has
            if (o.sequence > c.acked_) {
              c.start(t, next, o);
              ++c.stats_->resent;
            }
          }
        }
      }
      c.release(send_reply);
    } else if (next < 0 && c.layout_->head(c.shard_) >= 0) {
      c.acknowledge(t, c.applied_);
    }
    c.seen_ = c.layout_->chain(c.shard_);
  }

 private:
  Chain& self() noexcept { return static_cast<Chain&>(*this); }
};

}  // namespace dtrain::ps
