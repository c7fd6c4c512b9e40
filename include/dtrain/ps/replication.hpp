#pragma once
/// @file
/// `ps::shard_chain`: one server's part in one shard's chain (ps/chain.hpp for the layout).
///
///  - The head applies what workers push as its consistency model says, then `forward`s each
///    update it applied (a push under ASP and SSP; a barrier round's or a soft-sync group's mean
///    under BSP and soft sync: aggregated before it is replicated, so replication costs one
///    update per round, not one per worker) to the next live server of the chain, numbered in
///    sequence and stamped with where it came from (the worker and request id of a push, or the
///    round's clock), which a new head deduplicates re-sent requests by.
///  - Each copy applies the update through its own updater with the same step information, so
///    every copy, updater state included, stays bit for bit equal to the head's; it relays the
///    update on, or, as the tail, acknowledges the sequence number to the head.
///  - The head sends no reply while an update it applied is not yet at the tail (`hold`): a push
///    is acknowledged, a clock released and a pull answered only from state every copy holds.
///  - When a server of the chain is lost (`chain_changed`): the next copy heads the shard and
///    numbers on from what it applied; a head whose successor died sends the updates the tail has
///    not acknowledged to the new successor, and a new tail acknowledges what it holds.
///  - A server joins the chain as its new tail (`add_member`): the head sends a membership
///    update down the chain, numbered like an update; the copy that was the tail sends the
///    joiner the shard's state as of that update, then passes on every later update to it, and
///    the joiner, the tail now, acknowledges to the head from then on. These two changes of
///    membership are ps/chain_membership.hpp's, a CRTP part of this class.
///  - At the end the head says goodbye to its chain once the tail holds everything.
/// Sequence numbers are checked: an update that skips one is a protocol error (one was lost), a
/// repeated one is passed on without being applied again.

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/concepts/sharding.hpp"
#include "dtrain/concepts/transport.hpp"
#include "dtrain/core/deadline.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/signature.hpp"
#include "dtrain/ps/chain.hpp"
#include "dtrain/ps/chain_membership.hpp"
#include "dtrain/ps/protocol.hpp"
#include "dtrain/ps/stats.hpp"

namespace dtrain::ps {

/// Where an update came from: worker `worker`'s push with request id `id`, or (worker
/// `no_worker`) the mean of the round or group of clock `id`.
struct update_origin {
  std::uint32_t worker = no_worker;
  std::uint64_t id = 0;
};

/// One server's side of one shard's chain over `Transport`; the server calls it from its one
/// thread. With one replica it does nothing and holds nothing.
template <transport Transport, class T>
class shard_chain : public chain_membership<shard_chain<Transport, T>> {
  friend class chain_membership<shard_chain>;

 public:
  /// @param layout the job's chains (the server's, shared by its shards: losses show at once)
  /// @param me this server's index @param tag the servers' request tag
  shard_chain(chain_layout& layout, int shard, int me, std::uint64_t tag, std::chrono::milliseconds timeout,
              replication_stats& stats)
      : layout_(&layout), shard_(shard), me_(me), tag_(tag), timeout_(timeout), stats_(&stats),
        was_head_(layout.head(shard) == me) {}

  /// Whether updates go down a chain: k > 1, or a server joined this shard's (a standby taking
  /// a leaving server's place, with one copy).
  bool replicating() const noexcept { return layout_->replicas() > 1 || layout_->has_joined(shard_); }
  bool heads() const noexcept { return layout_->head(shard_) == me_; }
  int shard() const noexcept { return shard_; }

  /// The last update this server applied or forwarded, and where the last push of each worker
  /// and the last round it holds came from: what a new head deduplicates re-sends by.
  std::uint64_t sequence() const noexcept { return was_head_ ? forwarded_ : applied_; }
  std::uint64_t last_push_of(std::uint32_t worker) const {
    const auto it = last_push_.find(worker);
    return it == last_push_.end() ? 0 : it->second;
  }
  /// Rounds (barrier models) applied: the clock after the last round's.
  std::int64_t rounds_applied() const noexcept { return rounds_applied_; }
  const std::map<std::uint32_t, std::uint64_t>& last_pushes() const noexcept { return last_push_; }

  // --- the head -----------------------------------------------------------------------------------

  /// Sends an update this server applies to its shard (its `length` values per key for `keys`,
  /// with the staleness the updater sees) down the chain. A no-op with one replica or alone.
  /// @param frame the received request `values` lie in, if they do: the send takes it, and the
  ///   values go down the chain from where they arrived instead of being copied
  void forward(Transport& t, table_id which, std::span<const key_type> keys, std::span<const T> values,
               std::size_t length, std::uint64_t staleness, update_origin from, std::vector<std::byte>* frame = nullptr,
               bool last_of_version = true) {
    note(from);
    if (!replicating()) return;
    if (!holding()) last_progress_ = clock::now();
    ++forwarded_;
    if (layout_->successor(shard_, me_) < 0) {  // the last live copy: it is its own tail
      acked_ = forwarded_;
      return;
    }
    ++stats_->forwarded;
    outgoing& o = unacked_.emplace_back();
    o.sequence = forwarded_;
    request_header h{op::replicate, which, forwarded_, static_cast<std::int64_t>(from.id), staleness, keys.size(),
                     static_cast<std::uint32_t>(length), from.worker};
    h.shard = static_cast<std::uint32_t>(shard_);
    h.flags = last_of_version ? std::uint32_t{ends_version} : 0;
    encode_request_header(h, keys.size(), std::span(o.header));
    o.keys.assign(keys.begin(), keys.end());
    if constexpr (std::endian::native != std::endian::little) {
      for (auto& k : o.keys) k = __builtin_bswap64(k);
    }
    const auto* v = reinterpret_cast<const std::byte*>(values.data());
    if (frame != nullptr && !values.empty() && v >= frame->data() &&
        v + values.size_bytes() <= frame->data() + frame->size()) {
      o.frame = std::move(*frame);  // the heap block moves with it: `values` still points into it
    } else {
      o.values.assign(values.begin(), values.end());
      values = o.values;
    }
    o.value_bytes = std::as_bytes(values);
    start(t, layout_->successor(shard_, me_), o);
  }

  /// A buffer for the receive ring in place of a frame `forward` took (one that an
  /// acknowledged update has finished with, when there is one).
  std::vector<std::byte> spare() {
    if (spares_.empty()) return {};
    std::vector<std::byte> b = std::move(spares_.back());
    spares_.pop_back();
    return b;
  }

  /// Whether an update this server applied is not yet at the tail: replies must then wait.
  bool holding() const noexcept { return acked_ < forwarded_; }

  /// Keeps a reply to rank `to` until every update applied so far is at the tail.
  void hold(int to, message reply) {
    held_.push_back({forwarded_, to, std::move(reply)});
    ++stats_->held_replies;
  }

  /// Gives up the held replies, calling `refuse(to, op, request id)` for each (the server is
  /// failing: they would never be released).
  template <class Refuse>
  void abandon_held(Refuse&& refuse) {
    for (held_reply& h : held_) {
      refuse(h.to, static_cast<op>(dtrain::detail::wire::get<std::uint8_t>(h.reply.data() + 4)),
             dtrain::detail::wire::get<std::uint64_t>(h.reply.data() + 8));
    }
    held_.clear();
  }

  /// Why this server must fail, when the tail has not acknowledged an update within the
  /// timeout (naming the tail and the update); empty otherwise.
  std::string overdue() const {
    if (!holding() || clock::now() - last_progress_ <= timeout_) return {};
    return "ps::server " + std::to_string(me_) + ": server " + std::to_string(layout_->tail(shard_)) +
           ", the tail of shard " + std::to_string(shard_) + ", has not acknowledged update " +
           std::to_string(acked_ + 1) + " within " + std::to_string(timeout_.count()) + " ms";
  }

  // --- every member ---------------------------------------------------------------------------------

  /// Whether a message of kind `what` from server `from` fits this chain as this server sees
  /// it; if not, whether it would once servers this one has not yet seen lost are (a message
  /// that overtook this server's own news of a loss: the server keeps it for later).
  enum class fit { yes, later, no };
  fit fits(op what, int from) const {
    const int pf = layout_->position(shard_, from), pm = layout_->position(shard_, me_);
    // An acknowledgement may come from any copy after the head: from one that was the tail
    // before a server joined after it, it still says that every copy but the joiner holds it.
    const bool now = what == op::replicate   ? layout_->predecessor(shard_, me_) == from
                     : what == op::replicated ? heads() && pf > 0 && !layout_->gone(shard_, from)
                     : what == op::goodbye    ? layout_->head(shard_) == from && from != me_
                     : what == op::join       ? heads()
                                              : false;
    if (now) return fit::yes;
    if (what == op::join) return pm >= 0 && !layout_->gone(shard_, from) ? fit::later : fit::no;
    if (pf < 0 || pm < 0 || layout_->gone(shard_, from)) return fit::no;
    const bool before_me = what == op::replicate || what == op::goodbye;
    return (before_me ? pf < pm : pf > pm) ? fit::later : fit::no;
  }

  /// Handles a message that fits (`fits`): an update to apply (`apply(which, keys, values,
  /// length, staleness, whether it ends a version)`) and pass on, an acknowledgement, or a
  /// head's goodbye. Replies it releases go through `send_reply(to, message)`. An update passed
  /// on is sent as it arrived, in the buffer `take_frame()` hands over. A membership update
  /// that makes a joiner this server's successor calls `send_state(joiner)` instead.
  /// @throws dtrain::error `protocol_error` for an update that skips one
  template <class TakeFrame, class Apply, class SendReply, class SendState>
  void handle(Transport& t, int from, const request_view<T>& r, TakeFrame&& take_frame, Apply&& apply,
              SendReply&& send_reply, SendState&& send_state) {
    const request_header& h = r.header;
    switch (h.what) {
      case op::replicate: {
        if (h.id > applied_ + 1) {
          refuse(from, "sent update " + std::to_string(h.id) + " of shard " + std::to_string(shard_) + " after " +
                           std::to_string(applied_) + ": one was lost");
        }
        if ((h.flags & membership) != 0) {
          const int joiner = static_cast<int>(h.worker);
          if (h.id == applied_ + 1) {
            layout_->join(shard_, joiner);
            applied_ = h.id;
          }
          // The copy before the joiner (or, for one sent again, before it now): it starts from
          // this copy's state, which holds this update and every one before.
          if (layout_->successor(shard_, me_) == joiner) {
            send_state(joiner);
            break;
          }
        }
        // Passed on (or acknowledged) first and applied while it travels: this copy has it now
        // whatever happens, and its updater's work leaves the chain's critical path.
        if (const int next = layout_->successor(shard_, me_); next >= 0) {
          outgoing& o = relays_.emplace_back();
          o.frame = take_frame();
          o.value_bytes = std::span<const std::byte>(o.frame);
          start(t, next, o, true);
          ++stats_->relayed;
        } else {
          acknowledge(t, h.id);
        }
        if (h.id == applied_ + 1) {  // a repeat (after a loss) is passed on, not applied again
          apply(h.table, std::span<const key_type>(r.keys), r.typed_values(), static_cast<std::size_t>(h.length),
                h.basis, (h.flags & ends_version) != 0);
          applied_ = h.id;
          note({h.worker, static_cast<std::uint64_t>(h.clock)});
          ++stats_->applied;
        }
        break;
      }
      case op::replicated:
        if (h.id > forwarded_)
          refuse(from, "acknowledged update " + std::to_string(h.id) + " of shard " + std::to_string(shard_));
        if (h.id > acked_) {
          acked_ = h.id;
          last_progress_ = clock::now();
        }
        release(send_reply);
        break;
      case op::goodbye: head_said_goodbye_ = true; break;
      default: refuse(from, std::string("sent a ") + op_name(h.what));
    }
  }

  // --- the end of the job ---------------------------------------------------------------------------

  /// Once the head's workers have left and the tail holds everything, it says goodbye to the
  /// rest of the chain (once). @returns true when this server is done with the shard: as its
  /// head, it said goodbye; as a copy, the head said goodbye to it.
  bool finished(Transport& t, bool workers_left) {
    if (!replicating()) return true;
    if (!heads()) return head_said_goodbye_;
    if (!workers_left || holding()) return false;
    if (!said_goodbye_) {
      said_goodbye_ = true;
      for (int s : layout_->chain(shard_)) {
        if (s == me_) continue;
        outgoing& o = relays_.emplace_back();
        request_header h{op::goodbye, table_id::sparse, 0, 0, 0, 0, 0, 0};
        h.shard = static_cast<std::uint32_t>(shard_);
        encode_request_header(h, 0, std::span(o.header));
        start(t, s, o, true);
      }
    }
    return true;
  }

  /// Forgets the sends that completed (an update only once the tail acknowledged it: it may
  /// have to go to a new successor), keeping a few frames for `spare`.
  void reap() {
    while (!relays_.empty() && relays_.front().sent()) {
      recycle(std::move(relays_.front().frame));
      relays_.pop_front();
    }
    while (!unacked_.empty() && unacked_.front().sequence <= acked_ && unacked_.front().sent()) {
      recycle(std::move(unacked_.front().frame));
      unacked_.pop_front();
    }
  }

  /// Waits until every send has left or `d` passes.
  void flush(deadline d) noexcept {
    for (auto* q : {&relays_, &unacked_}) {
      for (auto& o : *q) {
        for (auto& h : o.handles) {
          std::error_code ec;
          h.wait(d, ec);
        }
      }
      q->clear();
    }
  }

 private:
  using clock = std::chrono::steady_clock;
  using send_handle = decltype(std::declval<Transport&>().isend(0, 0, signature{}, gather_list{}));

  // A message to another server: its header, keys and values (copies, or in a received frame).
  struct outgoing {
    std::uint64_t sequence = 0;
    std::array<std::byte, header_bytes> header{};
    std::vector<key_type> keys;
    std::vector<T> values;
    std::vector<std::byte> frame;
    std::span<const std::byte> value_bytes;
    std::vector<send_handle> handles;  // one per time it was sent
    int joiner = -1;                   // a membership update: the server it adds
    bool sent() {
      return std::all_of(handles.begin(), handles.end(), [](send_handle& h) { return h.test(); });
    }
  };

  struct held_reply {
    std::uint64_t after;  // sent once the tail holds this update
    int to;
    message reply;
  };

  void note(update_origin from) {
    if (from.worker == no_worker) {
      rounds_applied_ = std::max(rounds_applied_, static_cast<std::int64_t>(from.id) + 1);
    } else {
      auto& last = last_push_[from.worker];
      last = std::max(last, from.id);
    }
  }

  /// Sends the held replies whose updates the tail now holds, oldest first.
  template <class SendReply>
  void release(SendReply&& send_reply) {
    while (!held_.empty() && held_.front().after <= acked_) {
      send_reply(held_.front().to, std::move(held_.front().reply));
      held_.pop_front();
    }
  }

  void acknowledge(Transport& t, std::uint64_t sequence) {
    outgoing& o = relays_.emplace_back();
    request_header h{op::replicated, table_id::sparse, sequence, 0, 0, 0, 0, 0};
    h.shard = static_cast<std::uint32_t>(shard_);
    encode_request_header(h, 0, std::span(o.header));
    start(t, layout_->head(shard_), o, true);
  }

  // A received frame a send is done with becomes a spare for the receive ring.
  void recycle(std::vector<std::byte>&& frame) {
    if (!frame.empty() && spares_.size() < 4) spares_.push_back(std::move(frame));
  }

  // Sends `o` to `to`: header, keys and values, or (`as_frame`) its frame as it is.
  void start(Transport& t, int to, outgoing& o, bool as_frame = false) {
    std::array<std::span<const std::byte>, 3> parts{std::span<const std::byte>(o.header),
                                                    std::as_bytes(std::span(o.keys)), o.value_bytes};
    const gather_list list = as_frame && !o.frame.empty() ? gather_list(std::span(parts).last(1)) : gather_list(parts);
    for (const auto& p : list) stats_->bytes += p.size();
    o.handles.push_back(t.isend(to, tag_, signature{}, list));
  }

  [[noreturn]] void refuse(int from, const std::string& what) const {
    throw error(errc::protocol_error, "ps::server " + std::to_string(me_) + ": server " + std::to_string(from) + " " +
                                          what + " (" + std::to_string(layout_->replicas()) + " replicas on " +
                                          std::to_string(layout_->servers()) + " servers)");
  }

  chain_layout* layout_;
  int shard_, me_;
  std::uint64_t tag_;
  std::chrono::milliseconds timeout_;
  replication_stats* stats_;
  bool was_head_;
  std::vector<int> seen_ = layout_->chain(shard_);  // the live chain, as `chain_changed` last saw it
  std::uint64_t forwarded_ = 0, acked_ = 0;  // as the head
  std::uint64_t applied_ = 0;                // as a copy
  std::map<std::uint32_t, std::uint64_t> last_push_;
  std::int64_t rounds_applied_ = 0;
  clock::time_point last_progress_{};
  bool head_said_goodbye_ = false, said_goodbye_ = false;
  std::deque<held_reply> held_;
  std::deque<outgoing> unacked_;  // forwarded, not yet acknowledged by the tail (deques: parts never move)
  std::deque<outgoing> relays_;   // relays, acknowledgements, goodbyes
  std::vector<std::vector<std::byte>> spares_;
};

}  // namespace dtrain::ps
