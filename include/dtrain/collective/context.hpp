#pragma once
/// @file
/// The execution context of one collective call: sends and receives on the communicator's tag,
/// with the call's signature checked on every message and its deadline on every wait.
/// Algorithms are written against this; it turns transport failures into errors that name the
/// operation, its sequence number and the peer.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/concepts/element.hpp"
#include "dtrain/concepts/transport.hpp"
#include "dtrain/core/deadline.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/signature.hpp"
#include "dtrain/flight/recorder.hpp"

namespace dtrain::detail {

/// Offsets of `parts` nearly equal blocks of `n` elements (the first n % parts one larger).
inline std::vector<std::size_t> balanced_offsets(std::size_t n, int parts) {
  std::vector<std::size_t> offs(static_cast<std::size_t>(parts) + 1);
  std::size_t base = n / static_cast<std::size_t>(parts);
  std::size_t extra = n % static_cast<std::size_t>(parts);
  for (std::size_t i = 0; i < static_cast<std::size_t>(parts); ++i) {
    offs[i + 1] = offs[i] + base + (i < extra ? 1 : 0);
  }
  return offs;
}

/// Offsets of `parts` blocks of exactly `block` elements.
inline std::vector<std::size_t> uniform_offsets(std::size_t block, int parts) {
  std::vector<std::size_t> offs(static_cast<std::size_t>(parts) + 1);
  for (std::size_t i = 0; i < offs.size(); ++i) offs[i] = i * block;
  return offs;
}

inline int mod(int a, int p) { return ((a % p) + p) % p; }

/// The most bytes one transport message of a collective carries. A longer buffer goes as several
/// messages of at most this size, cut the same way on both sides (they know its length), so no
/// frame reaches the TCP transport's cap (`tcp_options::max_frame_bytes`, 1 GiB) whatever the
/// algorithm sends at once (halving-doubling's halves, recursive doubling's whole vector).
///
/// Such a buffer also waits for the receiver's clear-to-send, an empty message on the call's
/// control tag sent once the receiver has posted every part: a transport keeps a message that
/// arrives before its receive, and recursive doubling's next partner sends early, so without it
/// a 2 GiB allreduce held up to 8 GiB a rank. While a send waits, every wait of the call polls.
inline constexpr std::size_t max_message_bytes = std::size_t{256} << 20;

template <transport Transport>
class call_context {
 public:
  using request = decltype(std::declval<Transport&>().isend(0, 0, signature{},
                                                             std::span<const std::byte>{}));

  /// One posted send or receive and what it was posted for, so a failure can be described. A
  /// buffer past `max_message_bytes` is several transport messages: the first in `req`, the
  /// others in `more` (empty, and not allocated, for every message below the cap).
  struct pending {
    request req;
    int peer = 0;
    std::size_t bytes = 0;  // the whole buffer's size
    bool is_send = false;
    std::vector<request> more{};
    std::size_t held = no_hold;  // a send past the cap: its entry in `held_`
    request clearance{};         // a receive past the cap: the clear-to-send it sent
  };

  /// `flight`: the call's entry in the flight recorder, told whom each wait is on.
  call_context(Transport& t, std::uint64_t tag, const signature& sig, deadline dl,
               std::chrono::milliseconds timeout, std::size_t segment_bytes, flight::recorder::handle flight = {})
      : t_(t), tag_(tag), sig_(sig), deadline_(dl), timeout_(timeout),
        segment_bytes_(segment_bytes), rank_(t.rank()), size_(t.size()), flight_(flight) {}

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  const signature& sig() const noexcept { return sig_; }

  /// Elements per pipeline segment for element type T (at least one).
  template <class T>
  std::size_t segment_elements() const noexcept {
    std::size_t n = segment_bytes_ / sizeof(T);
    return n == 0 ? 1 : n;
  }

  template <element T>
  pending send(int peer, std::span<const T> data) {
    auto bytes = std::as_bytes(data);
    if (bytes.size() <= max_message_bytes) return pending{t_.isend(peer, tag_, sig_, bytes), peer, bytes.size(), true};
    held_.push_back({peer, bytes, std::move(recv_control(peer).req), {}, false});
    pending p{request{}, peer, bytes.size(), true};
    p.held = held_.size() - 1;
    return p;
  }
  template <element T>
  pending send(int peer, std::span<T> data) {
    return send(peer, std::span<const T>(data));
  }

  template <element T>
  pending recv(int peer, std::span<T> data) {
    auto bytes = std::as_writable_bytes(data);
    pending p{t_.irecv(peer, tag_, bytes.first(part_size(bytes.size(), 0))), peer, bytes.size(), false};
    for (std::size_t at = max_message_bytes; at < bytes.size(); at += max_message_bytes) {
      p.more.push_back(t_.irecv(peer, tag_, bytes.subspan(at, part_size(bytes.size(), at))));
    }
    if (!p.more.empty()) p.clearance = std::move(send_control(peer).req);
    return p;
  }

  /// An empty message on the call's control tag: a credit or clear-to-send that algorithms use
  /// to keep a fast sender from running ahead of the room its receiver has posted.
  pending send_control(int peer) {
    return pending{t_.isend(peer, control_tag(), sig_, std::span<const std::byte>{}), peer, 0, true};
  }
  pending recv_control(int peer) {
    return pending{t_.irecv(peer, control_tag(), std::span<std::byte>{}), peer, 0, false};
  }

  /// Waits for one operation (every message of it); checks a receive's signature and size.
  /// @throws dtrain::error
  void wait(pending& p) {
    if (p.held != no_hold) {
      held_send& h = held_[p.held];
      while (!h.cleared) {
        await(h.clearance);
        release_cleared();
      }
      for (std::size_t i = 0; i < h.parts.size(); ++i) wait_part(p, h.parts[i], i * max_message_bytes);
      return;
    }
    wait_part(p, p.req, 0);
    for (std::size_t i = 0; i < p.more.size(); ++i) wait_part(p, p.more[i], (i + 1) * max_message_bytes);
    if (!p.more.empty()) wait_part(p, p.clearance, 0, true);
  }

 private:
  static constexpr std::size_t no_hold = static_cast<std::size_t>(-1);

  // A send past the cap, until its receiver clears it, then its parts.
  struct held_send {
    int peer;
    std::span<const std::byte> bytes;
    request clearance;
    std::vector<request> parts;
    bool cleared;
  };

  static std::size_t part_size(std::size_t total, std::size_t at) noexcept {
    return std::min(max_message_bytes, total - at);
  }

  // Clear-to-send messages travel apart from the data, which may flow both ways between two ranks.
  std::uint64_t control_tag() const noexcept { return tag_ ^ (std::uint64_t{1} << 63); }

  // Returns once `req` is done or no send of this call waits for its clearance any more (the
  // caller then blocks on `req` itself). Until then it waits on `req` in short slices, releasing
  // each send whose clearance arrives meanwhile (its receiver may be waiting for it).
  void await(request& req) {
    for (int slices = 0; !req.test() && release_cleared() && !deadline_.expired(); ++slices) {
      std::error_code ignored;
      req.wait(deadline::after(std::chrono::microseconds(slices < 100 ? 20 : 200)), ignored);
    }
  }

  // Posts the parts of every held send whose clearance has come. @returns whether any is still held.
  bool release_cleared() {
    bool waiting = false;
    for (held_send& h : held_) {
      if (h.cleared) continue;
      if (!h.clearance.test()) {
        waiting = true;
        continue;
      }
      h.cleared = true;  // first: the wait below may poll the others, never this one again
      pending control{std::move(h.clearance), h.peer, 0, false};
      wait_part(control, control.req, 0);  // done already; raises its failure or mismatch, named
      for (std::size_t at = 0; at < h.bytes.size(); at += max_message_bytes) {
        h.parts.push_back(t_.isend(h.peer, tag_, sig_, h.bytes.subspan(at, part_size(h.bytes.size(), at))));
      }
    }
    return waiting;
  }

  // Waits for the message of `p` that starts at byte `at` (`control`: a clear-to-send).
  void wait_part(pending& p, request& req, std::size_t at, bool control = false) {
    std::error_code ec;
    flight_.waiting(world_rank_of(p.peer), p.is_send);
    if (!held_.empty()) {
      await(req);  // may wait on a clearance from another peer, and record so
      flight_.waiting(world_rank_of(p.peer), p.is_send);
    }
    bool ok = req.wait(deadline_, ec);
    flight_.resumed();
    if (!p.is_send && !control && (ok || ec == errc::message_truncated)) {
      const envelope& e = req.info();
      if (!(e.sig == sig_)) mismatch(p.peer, e.sig);
      // Same signature, other size: the ranks disagree on a split (a v-form's counts).
      if (!ok || e.bytes != part_size(p.bytes, at)) {
        fail(ok ? make_error_code(errc::protocol_error) : ec,
             "received " + std::to_string(e.bytes) + " bytes from " + peer_name(p.peer) + " where " +
                 std::to_string(part_size(p.bytes, at)) + " were expected" +
                 (at > 0 ? " (part at byte " + std::to_string(at) + ")" : ""));
      }
    }
    if (ok) return;
    std::string what = p.is_send ? "send to " : "receive from ";
    what += peer_name(p.peer);
    // Transports that know more (which rank was lost, and how) say so. The rank lost may not be
    // this operation's peer: a transport fails the whole group when any rank is lost.
    std::string detail;
    if constexpr (requires { req.detail(); }) detail = std::string(req.detail());
    if (!detail.empty()) what += ": " + detail;
    if (ec == errc::timeout) {
      fail(errc::timeout, "timed out after " + std::to_string(timeout_.count()) +
                              " ms waiting for " + peer_name(p.peer) + " (" + what + ")");
    }
    // Another rank found the calls disagree and aborted the group; `detail` quotes its report.
    if (ec == errc::collective_mismatch) fail(ec, "during " + what);
    if (ec == errc::peer_lost) {
      fail(errc::peer_lost,
           (detail.empty() ? peer_name(p.peer) + " left the group" : std::string("the group lost a rank")) +
               " during " + what);
    }
    fail(ec, what + " failed");  // `error` appends ec.message()
  }

 public:
  void wait_all(std::vector<pending>& ps) {
    for (auto& p : ps) wait(p);
    ps.clear();
  }

  /// Sends `out` to `to` and receives `in` from `from`, both in flight at once.
  template <element T>
  void exchange(int to, std::span<const T> out, int from, std::span<T> in) {
    pending r = recv(from, in);
    pending s = send(to, out);
    wait(r);
    wait(s);
  }

  [[noreturn]] void fail(std::error_code ec, const std::string& what) const {
    throw error(ec, "dtrain: " + peer_name(rank_) + ": " + describe(sig_) + ": " + what);
  }
  [[noreturn]] void fail(errc e, const std::string& what) const { fail(make_error_code(e), what); }

 private:
  // "rank 3", or on a process group "rank 1 of group 'dp' (world rank 3)".
  std::string peer_name(int peer) const {
    if constexpr (requires { t_.describe_rank(peer); }) {
      return t_.describe_rank(peer);
    } else {
      return "rank " + std::to_string(peer);
    }
  }

  int world_rank_of(int peer) const {
    if constexpr (requires { t_.world_rank(peer); }) {
      return t_.world_rank(peer);
    } else {
      return peer;
    }
  }

  [[noreturn]] void mismatch(int peer, const signature& theirs) const {
    throw error(errc::collective_mismatch,
                "dtrain: collective mismatch: " + peer_name(rank_) + " is in " +
                    describe(sig_) + " but " + peer_name(peer) + " sent a message of " +
                    describe(theirs) +
                    "; every rank must call the same collectives in the same order with the "
                    "same type, count, op and root");
  }

  Transport& t_;
  std::uint64_t tag_;
  signature sig_;
  deadline deadline_;
  std::chrono::milliseconds timeout_;
  std::size_t segment_bytes_;
  int rank_;
  int size_;
  flight::recorder::handle flight_;
  std::deque<held_send> held_;  // a deque: `pending::held` indexes stay valid as it grows
};

}  // namespace dtrain::detail
