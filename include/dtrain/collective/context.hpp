#pragma once
/// @file
/// The execution context of one collective call: sends and receives on the communicator's tag,
/// with the call's signature checked on every message and its deadline on every wait.
/// Algorithms are written against this; it turns transport failures into errors that name the
/// operation, its sequence number and the peer.

#include <algorithm>
#include <chrono>
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
  };

  call_context(Transport& t, std::uint64_t tag, const signature& sig, deadline dl,
               std::chrono::milliseconds timeout, std::size_t segment_bytes)
      : t_(t), tag_(tag), sig_(sig), deadline_(dl), timeout_(timeout),
        segment_bytes_(segment_bytes), rank_(t.rank()), size_(t.size()) {}

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
    pending p{t_.isend(peer, tag_, sig_, bytes.first(part_size(bytes.size(), 0))), peer, bytes.size(), true};
    for (std::size_t at = max_message_bytes; at < bytes.size(); at += max_message_bytes) {
      p.more.push_back(t_.isend(peer, tag_, sig_, bytes.subspan(at, part_size(bytes.size(), at))));
    }
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
    return p;
  }

  /// Waits for one operation (every message of it); checks a receive's signature and size.
  /// @throws dtrain::error
  void wait(pending& p) {
    wait_part(p, p.req, 0);
    for (std::size_t i = 0; i < p.more.size(); ++i) wait_part(p, p.more[i], (i + 1) * max_message_bytes);
  }

 private:
  static std::size_t part_size(std::size_t total, std::size_t at) noexcept {
    return std::min(max_message_bytes, total - at);
  }

  // Waits for the message of `p` that starts at byte `at`.
  void wait_part(pending& p, request& req, std::size_t at) {
    std::error_code ec;
    bool ok = req.wait(deadline_, ec);
    if (!p.is_send && (ok || ec == errc::message_truncated)) {
      const envelope& e = req.info();
      if (!(e.sig == sig_)) mismatch(p.peer, e.sig);
      if (ok && e.bytes != part_size(p.bytes, at)) {
        fail(errc::protocol_error, "received " + std::to_string(e.bytes) + " bytes from " +
                                       peer_name(p.peer) + " where " + std::to_string(part_size(p.bytes, at)) +
                                       " were expected" + (at > 0 ? " (part at byte " + std::to_string(at) + ")" : ""));
      }
    }
    if (ok) return;
    std::string what = p.is_send ? "send to " : "receive from ";
    what += peer_name(p.peer);
    // Transports that know more (which rank was lost, and how) say so.
    if constexpr (requires { req.detail(); }) {
      if (!req.detail().empty()) what += ": " + std::string(req.detail());
    }
    if (ec == errc::timeout) {
      fail(errc::timeout, "timed out after " + std::to_string(timeout_.count()) +
                              " ms waiting for " + peer_name(p.peer) + " (" + what + ")");
    }
    if (ec == errc::peer_lost) {
      fail(errc::peer_lost, peer_name(p.peer) + " left the group during " + what);
    }
    fail(ec, what + " failed: " + ec.message());
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
};

}  // namespace dtrain::detail
