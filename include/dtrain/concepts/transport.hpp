#pragma once
/// @file
/// The `transport` concept: tagged point-to-point byte messages between the ranks of a group.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "dtrain/concepts/completion.hpp"
#include "dtrain/core/memory_space.hpp"
#include "dtrain/core/signature.hpp"

namespace dtrain {

/// The most byte ranges one message may be gathered from or scattered into.
inline constexpr std::size_t max_message_parts = 4;

/// Byte ranges sent as one message, in order: a header, then keys, then values, each where the
/// caller keeps it, so nothing is copied into a staging buffer first. The list itself is read
/// when the send starts; the bytes must stay valid until it completes.
using gather_list = std::span<const std::span<const std::byte>>;

/// Byte ranges one message is received into, in order (a header part, then the caller's own
/// buffer for the values). The list is read when the receive starts.
using scatter_list = std::span<const std::span<std::byte>>;

/// A group member knows its rank and the size of its group.
template <class T>
concept group_member = requires(const T& t) {
  { t.rank() } noexcept -> std::same_as<int>;
  { t.size() } noexcept -> std::same_as<int>;
};

/// It can start a send of bytes with a signature to one peer on a tag.
template <class T>
concept message_sender =
    requires(T& t, int peer, std::uint64_t tag, const signature& sig, std::span<const std::byte> b) {
      { t.isend(peer, tag, sig, b) } -> completion;
    };

/// It can also send a message gathered from several byte ranges.
template <class T>
concept gathering_sender =
    requires(T& t, int peer, std::uint64_t tag, const signature& sig, gather_list parts) {
      { t.isend(peer, tag, sig, parts) } -> completion;
    };

/// It can start a receive from one peer or `any_peer` on a tag, into a fixed buffer or into a
/// vector it resizes to the incoming message, or scattered over several byte ranges.
template <class T>
concept message_receiver =
    requires(T& t, int peer, std::uint64_t tag, std::span<std::byte> b, std::vector<std::byte>& v,
             scatter_list parts) {
      { t.irecv(peer, tag, b) } -> completion;
      { t.irecv(peer, tag, v) } -> completion;
      { t.irecv(peer, tag, parts, &v) } -> completion;
    };

/// A transport moves tagged byte messages between the ranks of a fixed group.
///  1. `t.rank()` and `t.size()` give this rank (0 <= rank < size) and the group size. noexcept.
///  2. `t.isend(peer, tag, sig, bytes)` starts sending `bytes` with signature `sig` to `peer` on
///     `tag` and returns a `completion`. It never blocks. Sending to oneself is allowed.
///  3. `t.irecv(peer, tag, buffer)` starts receiving one message from `peer` (or `any_peer`) on
///     `tag` into `buffer`; a larger message completes the receive with
///     `errc::message_truncated` and leaves the message consumed. It never blocks.
///  4. `t.irecv(peer, tag, vector)` is the same, resizing `vector` to the message: for traffic
///     whose size the receiver does not know (parameter-server requests).
///  5. `t.isend(peer, tag, sig, parts)` sends the bytes of `parts` (a `gather_list` of at most
///     `max_message_parts` ranges) as one message, as if they were contiguous.
///  6. `t.irecv(peer, tag, parts, overflow)` receives one message scattered over `parts` (at most
///     `max_message_parts`), filling them in order, and clears `*overflow`; a message larger
///     than the parts together is stored whole in `*overflow` (resized to it) instead, leaving
///     the parts untouched, or, with `overflow` null, completes with `errc::message_truncated`.
///     `info().bytes` says which: at most the parts' total, or more. For replies that are
///     usually of a known size (values landing straight in the caller's buffer) but may be an
///     error text of any size.
///  7. `T::memory_space` is the memory the byte spans live in (`host_memory` for inproc and TCP).
///  8. Optional: `T::reduce_piece_bytes`, how large the pieces of an exchange that reduces as it
///     receives (halving-doubling's) are on this transport: `reduce_piece_bytes_of<T>`. Both
///     partners cut alike, so every rank of a group must use the same transport type.
///  Semantics:
///  - Ordering: messages from one sender to one receiver on one tag match receives in the order
///    they were sent, and receives match in the order they were posted (MPI's non-overtaking
///    rule). There is no order across tags or senders.
///  - Blocking: only `wait` blocks, always under a deadline. A send may complete only once its
///    receive is posted (the in-process transport copies once, straight from the sender's buffer),
///    so a rank must post its receive before it waits on a send to a peer that does the same.
///  - Buffer lifetime: see `completion`; the transport never keeps a reference past completion.
///  - Thread safety: all members may be called concurrently from several threads (a trainer's
///    communication thread next to a parameter-server client).
///  - Failure: a peer that leaves the group fails the operations that need it with
///    `errc::peer_lost` instead of leaving them to time out.
///  - Determinism: a transport delivers bytes unchanged; it never reorders within the rule above.
///  A minimal model: tests/archetypes/archetypes.hpp `transport_archetype`.
template <class T>
concept transport = std::movable<T> && group_member<T> && message_sender<T> && gathering_sender<T> &&
                    message_receiver<T> && requires { typename T::memory_space; };

/// The piece of an exchange that reduces each piece as it lands, on transport `T`: its own
/// `T::reduce_piece_bytes`, else 128 KiB, small enough that a piece received is still in the cache
/// when it is reduced (shared memory, in-process). A transport whose every message costs system
/// calls and wake-ups (TCP) says more.
template <class T>
inline constexpr std::size_t reduce_piece_bytes_of = [] {
  if constexpr (requires { T::reduce_piece_bytes; }) {
    return std::size_t{T::reduce_piece_bytes};
  } else {
    return std::size_t{128} << 10;
  }
}();

}  // namespace dtrain
