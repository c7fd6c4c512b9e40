#pragma once
// The shared-memory engine's protocol: what one pass over a peer's rings does. Queued sends are
// framed and written into the peer's inbox ring; what this rank's ring from the peer holds is
// read as frames (data, remote, remote_done, goodbye) into the matching receives or held until
// one is posted; a peer that is gone fails what needs it, or the whole group. No locks and no
// threads here: the engine (engine.hpp) calls all of it under its lock and decides who runs it.

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/frame.hpp"
#include "dtrain/detail/match_queue.hpp"
#include "dtrain/detail/message_parts.hpp"
#include "dtrain/transport/byte_operation.hpp"
#include "dtrain/transport/shm/link.hpp"
#include "dtrain/transport/shm/ring.hpp"
#include "dtrain/transport/shm/segment.hpp"
#include "dtrain/transport/shm/stats.hpp"

namespace dtrain::detail::shm {

class protocol {
 public:
  protocol(int rank, int size, settings s, segment own, std::vector<segment> inboxes, const std::vector<int>& pids)
      : rank_(rank), size_(size), settings_(s), own_(std::move(own)),
        self_(reinterpret_cast<inbox_header*>(own_.data())), links_(static_cast<std::size_t>(size)) {
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      link& l = at(p);
      l.inbox = std::move(inboxes[static_cast<std::size_t>(p)]);
      l.peer = reinterpret_cast<inbox_header*>(l.inbox.data());
      l.out = ring_writer(ring_at(l.inbox.data(), rank, s.options.ring_bytes), s.options.ring_bytes,
                          "from " + rank_text(rank) + " to " + rank_text(p).substr(5));
      l.in = ring_reader(ring_at(own_.data(), p, s.options.ring_bytes), s.options.ring_bytes,
                         "from " + rank_text(p) + " to " + rank_text(rank).substr(5));
      l.watch = process_watch(pids[static_cast<std::size_t>(p)]);
      l.single_copy = s.options.single_copy_bytes > 0 &&
                      ring_at(l.inbox.data(), rank, s.options.ring_bytes)->single_copy.load() != 0;
    }
  }
  protocol(const protocol&) = delete;
  protocol& operator=(const protocol&) = delete;

 protected:
  ~protocol() = default;

  std::string rank_text(int r) const {
    const std::vector<int>& names = settings_.options.rank_names;
    return "rank " + std::to_string(names.empty() ? r : names[static_cast<std::size_t>(r)]);
  }
  link& at(int p) noexcept { return links_[static_cast<std::size_t>(p)]; }
  // Whether the peer at the other end of `l` has closed its inbox: it left, cleanly or failed.
  static bool closed(const link& l) noexcept { return l.peer->closed.load(std::memory_order_acquire) != 0; }

  std::string died_text(int p) const {
    return rank_text(p) + " (pid " + std::to_string(links_[static_cast<std::size_t>(p)].watch.pid()) +
           ") exited without leaving the group";
  }
  // Why `p` is gone. A rank that left because it lost a peer is not where a user should look:
  // name the peer whose process ended without closing its inbox, if one did.
  std::string left_text(int p) const {
    const std::string why = rank_text(p) + " has left the group";
    for (int q = 0; q < size_; ++q) {
      const link& l = links_[static_cast<std::size_t>(q)];
      if (q == rank_ || q == p || l.departed || closed(l)) continue;
      if (l.watch.exited()) return why + " after " + died_text(q);
    }
    return why;
  }
  // Tells a rank's threads something changed for it; a system call only when one sleeps.
  static void ring(inbox_header* h) noexcept {
    h->bell.fetch_add(1, std::memory_order_seq_cst);
    if (h->sleepers.load(std::memory_order_seq_cst) != 0) futex_wake(&h->bell);
  }

  void complete(byte_operation& op, std::error_code ec = {}, std::string why = {}) {
    op.complete(ec, std::move(why));
    completed_ = true;
    moved();
  }
  // Counts a step forward (bytes through a ring, a frame read, an operation done): a waiter that
  // sees steps keeps spinning.
  void moved() noexcept { moves_.store(moves_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }

  // Writes the queued sends to `p` into its ring while there is room.
  void pump_out(int p) {
    link& l = at(p);
    if (l.sendq.empty()) return;
    if (closed(l)) {
      for (auto& s : l.sendq) complete(*s, make_error_code(errc::peer_lost), left_text(p));
      l.sendq.clear();
      return;
    }
    while (!l.sendq.empty()) {
      byte_operation& op = *l.sendq.front();
      if (op.state == byte_operation::phase::queued) {
        const bool remote =
            op.kind == frame_kind::data && l.single_copy && op.data.bytes() >= settings_.options.single_copy_bytes;
        if (l.out.room() < frame_header::size + (remote ? remote_descriptor_bytes : 0)) break;  // headers go in whole
        op.state = byte_operation::phase::active;
        if (op.kind == frame_kind::data) {
          (remote ? sent_.single_copy_messages : sent_.ring_messages) += 1;
          (remote ? sent_.single_copy_bytes : sent_.ring_bytes) += op.data.bytes();
          const std::size_t threshold = settings_.options.single_copy_bytes;
          const bool large = threshold > 0 && op.data.bytes() >= threshold;
          if (large && !remote) ++sent_.large_ring_messages;
        }
        frame_header h;
        h.kind = remote ? frame_kind::remote : op.kind;
        h.tag = op.env.tag;
        h.seq = l.tx_seq++;
        h.length = op.data.bytes();
        h.sig = op.env.sig;
        op.header = encode_frame(h);
        if (remote) {  // the peer reads the payload from here and says when it has
          const remote_descriptor d = encode_remote(op.data);
          l.out.put(op.header.data(), op.header.size());
          l.out.put(d.data(), d.size());
          l.out.publish();
          ring(l.peer);
          l.awaiting.emplace(h.seq, std::move(l.sendq.front()));
          l.sendq.pop_front();
          continue;
        }
      }
      for (std::size_t room; op.written < op.total() && (room = l.out.room()) > 0;) {
        write_out(l.out, op, std::min({room, op.total() - op.written, chunk_bytes}));
        l.out.publish();
        ring(l.peer);
        moved();
      }
      if (op.written < op.total()) break;
      byte_op_ptr done = std::move(l.sendq.front());
      l.sendq.pop_front();
      complete(*done);
    }
  }

  // Reads what `p`'s ring holds: frame headers, then payloads into their receives. With
  // `unexpected::leave` data stays in the ring while nothing waits behind it: taking it would
  // cost a buffer and a second copy, and a send may wait for its receive (the transport
  // concept's rule).
  void pump_in(int p, unexpected policy) {
    link& l = at(p);
    for (;;) {
      const std::size_t ready = l.in.ready();
      if (!l.rx_active) {
        if (ready < frame_header::size) return;
        frame_bytes bytes;
        l.in.peek(bytes.data(), bytes.size());
        const frame_decode_result d = decode_frame(bytes, l.rx_seq, settings_.options.max_message_bytes);
        if (policy == unexpected::leave && !wanted(p, d)) return;
        l.in.skip(bytes.size());
        l.in.publish();
        begin_frame(p, d);
        continue;
      }
      const std::size_t n = std::min({ready, l.rx_frame.length - l.rx_got, chunk_bytes});
      if (n > 0) {
        if (l.rx_truncated) {
          l.in.skip(n);
        } else {
          read_in(l, n);
        }
        l.rx_got += n;
        l.in.publish();
        ring(l.peer);  // room for its next bytes
        moved();
      }
      if (l.rx_got == l.rx_frame.length) {
        end_frame(p);
      } else if (n == 0) {
        return;
      }
    }
  }

  // Whether a frame is one to read now: anything but data while nothing waits on `p`'s ring (a
  // receive from `p`, or the acknowledgement of a single copy, is reached only by reading what
  // comes before it; a remote frame is only its ranges; a bad header counts as wanted, reading
  // it fails the group).
  bool wanted(int p, const frame_decode_result& d) const {
    const link& l = links_[static_cast<std::size_t>(p)];
    return !d.ok || d.header.kind != frame_kind::data || queue_.has_receive_from(p) || !l.awaiting.empty();
  }

  // Whether an operation waits on a peer: what a progress thread would move bytes for.
  bool has_pending() const noexcept {
    return queue_.has_receives() || std::any_of(links_.begin(), links_.end(), [](const link& l) {
             return !l.sendq.empty() || !l.awaiting.empty() || l.rx_active;
           });
  }

  void begin_frame(int p, const frame_decode_result& d) {
    link& l = at(p);
    if (!d.ok) throw error(errc::protocol_error, "dtrain: " + l.in.name() + " holds a bad frame: " + d.error);
    ++l.rx_seq;
    if (d.header.kind == frame_kind::goodbye) {
      l.departed = true;
      for (auto& r : queue_.take_receives_from(p)) {
        complete(*r, make_error_code(errc::peer_lost), left_text(p));
      }
      return;
    }
    if (d.header.kind == frame_kind::remote_done) {
      auto it = l.awaiting.find(d.header.tag);
      if (it == l.awaiting.end()) {
        throw error(errc::protocol_error, "dtrain: " + l.in.name() + " acknowledges frame " +
                                              std::to_string(d.header.tag) + ", which was never sent");
      }
      complete(*it->second);
      l.awaiting.erase(it);
      return;
    }
    if (d.header.kind == frame_kind::remote) return begin_remote(p, d.header);
    if (d.header.kind == frame_kind::abort && d.header.length > max_abort_reason_bytes) {
      throw error(errc::protocol_error, "dtrain: " + l.in.name() + " holds an abort frame longer than " +
                                            std::to_string(max_abort_reason_bytes) + " bytes");
    }
    if (d.header.kind != frame_kind::data && d.header.kind != frame_kind::abort) {
      throw error(errc::protocol_error, "dtrain: " + l.in.name() + " holds a control frame it never carries");
    }
    l.rx_active = true;
    l.rx_frame = d.header;
    l.rx_got = 0;
    if (byte_op_ptr r = d.header.kind == frame_kind::data ? queue_.take_receive({p, d.header.tag}) : nullptr) {
      r->state = byte_operation::phase::active;
      r->env = envelope{p, d.header.tag, d.header.sig, d.header.length};
      landing into = land(r->buffer, r->grow, d.header.length);
      l.rx_parts = into.parts;
      l.rx_truncated = into.truncated;
      l.rx_recv = std::move(r);
      return;
    }
    auto m = std::make_shared<early_message>();
    m->peer = p;
    m->tag = d.header.tag;
    m->sig = d.header.sig;
    m->length = d.header.length;
    m->data = std::make_unique_for_overwrite<std::byte[]>(m->length);
    l.rx_parts = receive_parts(std::span<std::byte>(m->data.get(), m->length));
    l.rx_truncated = false;
    l.rx_early = std::move(m);
  }

  // A payload left in the sender's memory: read now into a posted receive, or when one comes.
  void begin_remote(int p, const frame_header& h) {
    link& l = at(p);
    remote_descriptor bytes;
    if (l.in.ready() < bytes.size())
      throw error(errc::protocol_error, "dtrain: " + l.in.name() + " cuts a remote frame short");
    l.in.take(bytes.data(), bytes.size());
    l.in.publish();
    std::optional<remote_ranges> ranges = decode_remote(bytes, h.length);
    if (!ranges) throw error(errc::protocol_error, "dtrain: " + l.in.name() + " holds malformed remote ranges");
    ranges->frame_seq = h.seq;
    auto m = std::make_shared<early_message>();
    m->peer = p;
    m->tag = h.tag;
    m->sig = h.sig;
    m->length = h.length;
    m->complete = true;
    m->remote = ranges;
    if (byte_op_ptr r = queue_.take_receive({p, h.tag})) {
      deliver(*m, *r);
    } else {
      queue_.hold(std::move(m));
    }
  }

  void end_frame(int p) {
    link& l = at(p);
    l.rx_active = false;
    if (byte_op_ptr r = std::move(l.rx_recv)) {
      complete(*r, l.rx_truncated ? make_error_code(errc::message_truncated) : std::error_code{});
      return;
    }
    early_message_ptr m = std::move(l.rx_early);
    if (!m) return;  // its receive was abandoned
    if (l.rx_frame.kind == frame_kind::abort) {  // the peer's group failed, and it says why
      return fail_group(abort_code(m->tag), rank_text(p) + " aborted the group: " +
                                             abort_reason(std::span<const std::byte>(m->data.get(), m->length)));
    }
    m->complete = true;
    if (byte_op_ptr r = queue_.take_receive({p, m->tag})) {
      deliver(*m, *r);
    } else {
      queue_.hold(std::move(m));
    }
  }

  // Completes a receive from a message that arrived before it.
  void deliver(const early_message& m, byte_operation& r) {
    r.state = byte_operation::phase::active;
    r.env = envelope{m.peer, m.tag, m.sig, m.length};
    if (m.remote) return deliver_remote(m, r);
    const std::span<const std::byte> whole(m.data.get(), m.length);
    const bool fits = copy_message(send_parts(whole), r.buffer, r.grow);
    complete(r, fits ? std::error_code{} : make_error_code(errc::message_truncated));
  }

  // One copy from the sender's memory, then the acknowledgement that frees its buffer.
  void deliver_remote(const early_message& m, byte_operation& r) {
    link& l = at(m.peer);
    const landing into = land(r.buffer, r.grow, m.length);
    const int err = into.truncated || l.lost ? 0 : read_process(l.watch.pid(), into.parts, *m.remote);
    if (err != 0) {
      const bool gone = err == ESRCH;
      complete(r, make_error_code(gone ? errc::peer_lost : errc::protocol_error),
               rank_text(m.peer) + (gone ? " exited before its message was read" : "'s message cannot be read: ") +
                   (gone ? "" : std::strerror(err)));
      if (gone) return;
    } else {
      complete(r, into.truncated ? make_error_code(errc::message_truncated) : std::error_code{});
    }
    auto ack = std::make_shared<byte_operation>();
    ack->is_send = true;
    ack->kind = frame_kind::remote_done;
    ack->env = envelope{m.peer, m.remote->frame_seq, signature{}, 0};
    l.sendq.push_back(std::move(ack));
  }

  void send_to_self(const byte_op_ptr& op) {
    auto m = std::make_shared<early_message>();
    m->peer = rank_;
    m->tag = op->env.tag;
    m->sig = op->env.sig;
    m->length = op->data.bytes();
    m->data = std::make_unique_for_overwrite<std::byte[]>(m->length);
    m->complete = true;
    scatter_copy(op->data, receive_parts(std::span<std::byte>(m->data.get(), m->length)));
    if (byte_op_ptr r = queue_.take_receive({rank_, m->tag})) {
      deliver(*m, *r);
    } else {
      queue_.hold(std::move(m));
    }
    complete(*op);
  }

  // A peer whose process is gone without a goodbye (its last frames read first) is lost.
  void watch_peers() {
    for (int p = 0; p < size_; ++p) {
      if (p == rank_ || at(p).departed || at(p).lost || !at(p).watch.exited()) continue;
      try {
        pump_in(p, unexpected::take);
      } catch (const error&) {
      }
      // A rank that failed closes its inbox without a goodbye: it left, it did not die.
      if (!at(p).departed) lose(p, closed(at(p)) ? left_text(p) : died_text(p));
    }
  }

  // Fails what needs `p`, or the whole group where the group cannot go on without it.
  void lose(int p, const std::string& why) {
    if (settings_.options.abort_group_on_peer_loss) {
      fail_group(errc::peer_lost, why);
      return;
    }
    link& l = at(p);
    l.lost = true;
    for (auto& s : l.sendq) complete(*s, make_error_code(errc::peer_lost), why);
    l.sendq.clear();
    for (auto& [seq, s] : l.awaiting) complete(*s, make_error_code(errc::peer_lost), why);
    l.awaiting.clear();
    abandon_receive(l, make_error_code(errc::peer_lost), why);
    for (auto& r : queue_.take_receives_from(p)) complete(*r, make_error_code(errc::peer_lost), why);
  }

  // Fails the receive a frame is being read into. The rest of the frame is skipped: its owner
  // may free the memory as soon as it is told.
  void abandon_receive(link& l, std::error_code ec, const std::string& why) {
    if (!l.rx_recv) return;
    complete(*l.rx_recv, ec, why);
    l.rx_recv.reset();
    l.rx_parts = receive_parts{};
    l.rx_truncated = true;
  }

  void fail_group(errc code, const std::string& why) {
    if (!failure_.empty()) return;
    failure_ = why;
    failure_code_ = code;
    const auto ec = make_error_code(code);
    for (auto& l : links_) {
      for (auto& s : l.sendq) complete(*s, ec, why);
      l.sendq.clear();
      for (auto& [seq, s] : l.awaiting) complete(*s, ec, why);
      l.awaiting.clear();
      abandon_receive(l, ec, why);
    }
    for (auto& r : queue_.take_all_receives()) complete(*r, ec, why);
    ring(self_);
  }

  const int rank_, size_;
  const settings settings_;
  segment own_;
  inbox_header* self_;
  std::vector<link> links_;  // by rank; this rank's own entry is unused
  shm_stats sent_;           // what went out by which path

  match_queue<byte_op_ptr, early_message_ptr, byte_match_keys> queue_;
  std::string failure_;
  errc failure_code_ = errc::peer_lost;
  bool completed_ = false;  // the current pass completed an operation
  std::atomic<std::uint64_t> moves_{0};  // steps forward; written under the engine's lock
};

}  // namespace dtrain::detail::shm
