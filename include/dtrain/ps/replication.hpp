#pragma once
/// @file
/// `ps::chain_replicator`: a server's part in chain replication (ps/chain.hpp for the layout).
///
///  - As the head of its shard, the server applies what workers push as its consistency model
///    says, then `forward`s each update it applied (a push under ASP and SSP; a barrier round's or
///    a soft-sync group's mean under BSP and soft sync: aggregated before it is replicated, so
///    replication costs one update per round, not one per worker) to the next server of the chain,
///    numbered in sequence.
///  - Each server in the chain applies the update through its own updater with the same step
///    information, so every copy, updater state included, stays bit for bit equal to the head's;
///    it relays the update on, or, as the tail, acknowledges the sequence number to the head.
///  - The head sends no reply while an update it applied is not yet at the tail (`hold`): a push
///    is acknowledged, a clock released and a pull answered only from state every copy holds, as
///    if the tail had answered.
///  - At the end a head says goodbye to its chain once the tail holds everything; a server leaves
///    when it has said goodbye and every head it holds a copy for has said goodbye to it.
/// Sequence numbers are checked: an update out of order is a protocol error (it would mean one
/// was lost), a repeated one is passed on without being applied again.

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "dtrain/concepts/sharding.hpp"
#include "dtrain/concepts/transport.hpp"
#include "dtrain/core/deadline.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/signature.hpp"
#include "dtrain/ps/chain.hpp"
#include "dtrain/ps/protocol.hpp"

namespace dtrain::ps {

/// What replication has done on one server.
struct replication_stats {
  std::uint64_t forwarded = 0;  ///< updates this server applied as a head and sent down its chain
  std::uint64_t applied = 0;    ///< updates applied as a copy of another head's shard
  std::uint64_t relayed = 0;    ///< updates passed on to the next copy
  std::uint64_t bytes = 0;      ///< bytes sent to other servers
  std::uint64_t held_replies = 0;  ///< replies that waited for the tail
};

/// One server's side of chain replication over `Transport`; the server calls it from its one
/// thread. With one replica it does nothing and holds nothing.
template <transport Transport, class T>
class chain_replicator {
 public:
  /// @param me this server's index (its rank) @param tag the servers' request tag
  chain_replicator(chain_layout layout, int me, std::uint64_t tag, std::chrono::milliseconds timeout)
      : layout_(layout), me_(me), tag_(tag), timeout_(timeout),
        applied_(static_cast<std::size_t>(layout.servers()), 0),
        heads_left_(layout.replicated_on(me)) {}

  bool replicating() const noexcept { return layout_.replicas() > 1; }
  const chain_layout& layout() const noexcept { return layout_; }
  const replication_stats& stats() const noexcept { return stats_; }

  // --- the head -----------------------------------------------------------------------------------

  /// Sends an update this server applies to its shard (its `length` values per key for `keys`,
  /// with the staleness the updater sees) down the chain. A no-op with one replica.
  /// @param frame the received request `values` lie in, if they do: the send takes it, and the
  ///   values go down the chain from where they arrived instead of being copied (they stay valid
  ///   until `reap`)
  void forward(Transport& t, table_id which, std::span<const key_type> keys, std::span<const T> values,
               std::size_t length, std::uint64_t staleness, std::vector<std::byte>* frame = nullptr) {
    if (!replicating()) return;
    if (forwarded_ == acked_) oldest_unacked_ = clock::now();
    outgoing& o = next_update(which, keys, length, staleness);
    const auto* v = reinterpret_cast<const std::byte*>(values.data());
    if (frame != nullptr && !values.empty() && v >= frame->data() && v + values.size_bytes() <= frame->data() + frame->size()) {
      o.frame = std::move(*frame);  // the heap block moves with it: `values` still points into it
    } else {
      o.values.assign(values.begin(), values.end());
      values = o.values;
    }
    const std::span<const std::byte> parts[] = {std::span<const std::byte>(o.header), std::as_bytes(std::span(o.keys)),
                                                std::as_bytes(values)};
    start(t, layout_.successor(me_, me_), o, parts);
  }

  /// A buffer for the receive ring in place of a frame `forward` took (one that an earlier
  /// forward has finished with, when there is one).
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
    ++stats_.held_replies;
  }

  // --- every server -------------------------------------------------------------------------------

  /// Handles a message from server `from`: an update to apply (`apply(which, keys, values,
  /// length, staleness)`) and pass on, an acknowledgement, or a head's goodbye. Replies it
  /// releases go through `send_reply(to, message)`. An update passed on is sent as it arrived,
  /// in the buffer `take_frame()` hands over (`r`'s values, which point into it, stay valid
  /// until `reap`).
  /// @throws dtrain::error `protocol_error` for a message that does not fit the chains
  template <class TakeFrame, class Apply, class SendReply>
  void handle(Transport& t, int from, const request_view<T>& r, TakeFrame&& take_frame, Apply&& apply,
              SendReply&& send_reply) {
    const request_header& h = r.header;
    const int shard = static_cast<int>(h.worker);
    if (shard < 0 || shard >= layout_.servers()) refuse(from, "names shard " + std::to_string(h.worker));
    switch (h.what) {
      case op::replicate: {
        if (layout_.predecessor(shard, me_) != from) refuse(from, "sent an update of shard " + std::to_string(shard) + " out of its chain");
        auto& applied = applied_[static_cast<std::size_t>(shard)];
        if (h.id > applied + 1) {
          refuse(from, "sent update " + std::to_string(h.id) + " of shard " + std::to_string(shard) + " after " +
                           std::to_string(applied) + ": one was lost");
        }
        // Passed on (or acknowledged) first and applied while it travels: this copy has it now
        // whatever happens, and its updater's work leaves the chain's critical path.
        if (const int next = layout_.successor(shard, me_); next >= 0) {
          outgoing& o = sends_.emplace_back();
          o.frame = take_frame();
          const std::span<const std::byte> parts[] = {std::span<const std::byte>(o.frame)};
          start(t, next, o, parts);
          ++stats_.relayed;
        } else {
          const request_header ack{op::replicated, table_id::sparse, h.id, 0, 0, 0, 0, static_cast<std::uint32_t>(shard)};
          send(t, layout_.head(shard), ack);
        }
        if (h.id == applied + 1) {  // a repeat (after a fail-over) is passed on, not applied again
          apply(h.table, std::span<const key_type>(r.keys), r.typed_values(), static_cast<std::size_t>(h.length), h.basis);
          applied = h.id;
          ++stats_.applied;
        }
        break;
      }
      case op::replicated:
        if (shard != me_ || from != layout_.tail(me_) || h.id > forwarded_) {
          refuse(from, "acknowledged update " + std::to_string(h.id) + " of shard " + std::to_string(shard));
        }
        if (h.id > acked_) {
          acked_ = h.id;
          oldest_unacked_ = clock::now();
        }
        release(send_reply);
        break;
      case op::goodbye: {
        const auto it = std::find(heads_left_.begin(), heads_left_.end(), shard);
        if (from != layout_.head(shard) || it == heads_left_.end()) refuse(from, "said goodbye for shard " + std::to_string(shard));
        heads_left_.erase(it);
        break;
      }
      default: refuse(from, std::string("sent a ") + op_name(h.what));
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
    if (!holding() || clock::now() - oldest_unacked_ <= timeout_) return {};
    return "ps::server " + std::to_string(me_) + ": server " + std::to_string(layout_.tail(me_)) + ", the tail of shard " +
           std::to_string(me_) + ", has not acknowledged update " + std::to_string(acked_ + 1) + " within " +
           std::to_string(timeout_.count()) + " ms";
  }

  // --- the end of the job ---------------------------------------------------------------------------

  /// Once every worker has left and the tail holds everything, says goodbye to the rest of the
  /// chain (once). @returns true when this server may stop: it said goodbye and every head it
  /// holds a copy for said goodbye to it.
  /// @throws dtrain::error `timeout` naming the heads that never said goodbye
  bool finished(Transport& t) {
    if (!replicating()) return true;
    if (holding()) return false;
    if (!said_goodbye_) {
      said_goodbye_ = true;
      goodbye_since_ = clock::now();
      for (int p = 1; p < layout_.replicas(); ++p) {
        const request_header h{op::goodbye, table_id::sparse, 0, 0, 0, 0, 0, static_cast<std::uint32_t>(me_)};
        send(t, layout_.member(me_, p), h);
      }
    }
    if (!heads_left_.empty() && clock::now() - goodbye_since_ > timeout_) {
      std::string names;
      for (int s : heads_left_) names += (names.empty() ? "" : ", ") + std::to_string(layout_.head(s));
      throw error(errc::timeout, "ps::server " + std::to_string(me_) + ": its workers have left but server " + names +
                                     " has not finished replicating to it within " + std::to_string(timeout_.count()) + " ms");
    }
    return heads_left_.empty();
  }

  /// Forgets the sends that completed, oldest first, keeping a few frames for `spare`.
  void reap() {
    while (!sends_.empty() && sends_.front().handle->test()) {
      recycle(std::move(sends_.front().frame));
      sends_.pop_front();
    }
  }

  /// Waits until every send has left or `d` passes.
  void flush(deadline d) noexcept { wait_all_sent(sends_, d); }

 private:
  using clock = std::chrono::steady_clock;
  using send_handle = decltype(std::declval<Transport&>().isend(0, 0, signature{}, gather_list{}));

  // A message to another server: its header, keys and values (copies, or in a received frame).
  struct outgoing {
    std::array<std::byte, header_bytes> header{};
    std::vector<key_type> keys;
    std::vector<T> values;
    std::vector<std::byte> frame;
    std::optional<send_handle> handle;
  };

  struct held_reply {
    std::uint64_t after;  // sent once the tail holds this update
    int to;
    message reply;
  };

  // The next update in sequence, its header written and its keys copied (little-endian).
  outgoing& next_update(table_id which, std::span<const key_type> keys, std::size_t length, std::uint64_t staleness) {
    ++forwarded_;
    ++stats_.forwarded;
    const request_header h{op::replicate, which, forwarded_, 0, staleness, keys.size(), static_cast<std::uint32_t>(length),
                           static_cast<std::uint32_t>(me_)};
    outgoing& o = sends_.emplace_back();
    encode_request_header(h, keys.size(), std::span(o.header));
    o.keys.assign(keys.begin(), keys.end());
    if constexpr (std::endian::native != std::endian::little) {
      for (auto& k : o.keys) k = __builtin_bswap64(k);
    }
    return o;
  }

  // A received frame a send is done with becomes a spare for the receive ring.
  void recycle(std::vector<std::byte>&& frame) {
    if (!frame.empty() && spares_.size() < 4) spares_.push_back(std::move(frame));
  }

  void start(Transport& t, int to, outgoing& o, gather_list parts) {
    for (const auto& p : parts) stats_.bytes += p.size();
    o.handle.emplace(t.isend(to, tag_, signature{}, parts));
  }

  // A message with no values (an acknowledgement, a goodbye).
  void send(Transport& t, int to, const request_header& h) {
    outgoing& o = sends_.emplace_back();
    encode_request_header(h, 0, std::span(o.header));
    const std::span<const std::byte> parts[] = {std::span<const std::byte>(o.header)};
    start(t, to, o, parts);
  }

  [[noreturn]] void refuse(int from, const std::string& what) const {
    throw error(errc::protocol_error, "ps::server " + std::to_string(me_) + ": server " + std::to_string(from) + " " + what +
                                          " (" + std::to_string(layout_.replicas()) + " replicas on " +
                                          std::to_string(layout_.servers()) + " servers)");
  }

  chain_layout layout_;
  int me_;
  std::uint64_t tag_;
  std::chrono::milliseconds timeout_;
  std::uint64_t forwarded_ = 0, acked_ = 0;  // this server's shard, as its head
  clock::time_point oldest_unacked_{};
  std::vector<std::uint64_t> applied_;  // per shard: the last update applied as a copy
  std::vector<int> heads_left_;         // shards whose heads have not said goodbye yet
  bool said_goodbye_ = false;
  clock::time_point goodbye_since_{};
  std::deque<held_reply> held_;
  std::deque<outgoing> sends_;  // a deque: a posted send's parts never move
  std::vector<std::vector<std::byte>> spares_;
  replication_stats stats_;
};

}  // namespace dtrain::ps
