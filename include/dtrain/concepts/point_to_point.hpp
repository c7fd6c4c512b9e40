#pragma once
/// @file
/// The `point_to_point` concept: typed, tagged messages of buffers in a communicator's memory
/// space between two ranks of its group, what pipeline stages on a device send each other.

#include <concepts>
#include <cstdint>

#include "dtrain/concepts/collective.hpp"
#include "dtrain/concepts/completion.hpp"
#include "dtrain/concepts/transport.hpp"

namespace dtrain {

/// A communicator whose ranks send each other buffers of `T`.
///  1. `c.isend(peer, tag, in)` starts sending `in` (a span in `C::memory_space`) to `peer` on
///     `tag`; `c.irecv(peer, tag, out)` starts receiving one message from `peer` on `tag` into
///     `out`. Both return a `completion` and never wait for the peer.
///  2. `c.send(peer, tag, in)` and `c.recv(peer, tag, out)` are the same, waited for under the
///     communicator's deadline.
///  Semantics:
///  - Progress: sends and receives complete independently of the order they were posted in (a
///    ring of ranks that each receive before they send completes).
///  - Ordering: messages from one rank to another on one tag match receives in the order sent.
///  - Checking: a message of another element type or count than its receive fails that receive
///    with `errc::collective_mismatch`, both described; the receive buffer is then unspecified.
///  - Errors and deadlines as the communicator's collectives: a timeout names the peer and tag.
///  Models: `staged_communicator` (collective/staged.hpp), `nccl_communicator` formed with
///  `nccl_options::point_to_point` (collective/nccl.hpp).
template <class C, class T>
concept point_to_point =
    group_member<C> && requires(C& c, int peer, std::uint64_t tag, buffer_of<C, const T> in, buffer_of<C, T> out) {
      { c.isend(peer, tag, in) } -> completion;
      { c.irecv(peer, tag, out) } -> completion;
      { c.send(peer, tag, in) } -> std::same_as<void>;
      { c.recv(peer, tag, out) } -> std::same_as<void>;
    };

}  // namespace dtrain
