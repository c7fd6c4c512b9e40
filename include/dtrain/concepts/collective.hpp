#pragma once
/// @file
/// The `collective` concept: the nine collective operations over one group.

#include <concepts>
#include <span>
#include <system_error>

#include "dtrain/concepts/element.hpp"
#include "dtrain/concepts/transport.hpp"
#include "dtrain/core/memory_space.hpp"
#include "dtrain/core/reduce_op.hpp"

namespace dtrain {

/// The buffers a collective takes: spans in its memory space (`std::span` on the host,
/// `device_span` on the device), so a buffer from the wrong space does not compile.
template <class C, class T>
using buffer_of = span_in<typename C::memory_space, T>;

/// Rooted operations that move data: broadcast, gather, scatter.
template <class C, class T>
concept rooted_data_collective =
    requires(C& c, buffer_of<C, T> buf, buffer_of<C, const T> in, int root, std::error_code& ec) {
      { c.broadcast(buf, root) } -> std::same_as<void>;
      { c.broadcast(buf, root, ec) } noexcept -> std::same_as<void>;
      { c.gather(in, buf, root) } -> std::same_as<void>;
      { c.gather(in, buf, root, ec) } noexcept -> std::same_as<void>;
      { c.scatter(in, buf, root) } -> std::same_as<void>;
      { c.scatter(in, buf, root, ec) } noexcept -> std::same_as<void>;
    };

/// Operations that combine contributions: reduce, allreduce, reduce-scatter, in place and not.
template <class C, class T>
concept reducing_collective = requires(C& c, buffer_of<C, T> buf, buffer_of<C, const T> in,
                                       reduce_op op, int root, std::error_code& ec) {
  { c.reduce(in, buf, op, root) } -> std::same_as<void>;
  { c.reduce(in, buf, op, root, ec) } noexcept -> std::same_as<void>;
  { c.reduce(buf, op, root) } -> std::same_as<void>;
  { c.allreduce(in, buf, op) } -> std::same_as<void>;
  { c.allreduce(in, buf, op, ec) } noexcept -> std::same_as<void>;
  { c.allreduce(buf, op) } -> std::same_as<void>;
  { c.allreduce(buf, op, ec) } noexcept -> std::same_as<void>;
  { c.reduce_scatter(in, buf, op) } -> std::same_as<void>;
  { c.reduce_scatter(in, buf, op, ec) } noexcept -> std::same_as<void>;
  { c.reduce_scatter(buf, op) } -> std::same_as<void>;
};

/// Operations where every rank sends to every rank: allgather, alltoall, in place and not.
template <class C, class T>
concept exchanging_collective =
    requires(C& c, buffer_of<C, T> buf, buffer_of<C, const T> in, std::error_code& ec) {
      { c.allgather(in, buf) } -> std::same_as<void>;
      { c.allgather(in, buf, ec) } noexcept -> std::same_as<void>;
      { c.allgather(buf) } -> std::same_as<void>;
      { c.alltoall(in, buf) } -> std::same_as<void>;
      { c.alltoall(in, buf, ec) } noexcept -> std::same_as<void>;
      { c.alltoall(buf) } -> std::same_as<void>;
    };

/// A collective runs the nine collective operations of one group on buffers of element type `T`.
///  1. `c.rank()`, `c.size()`: this rank and the group size. noexcept.
///  2. `C::memory_space`: where the buffers live (`host_memory` or `device_memory`); buffers
///     are `buffer_of<C, T>`: `std::span<T>` on the host, `device_span<T>` on the device.
///  3. `broadcast(buf, root)`: root's `buf` is copied to every rank's `buf`.
///  4. `reduce(in, out, op, root)` / `reduce(buf, op, root)`: root's `out` gets the element-wise
///     reduction of every rank's `in`; `out` is not touched elsewhere.
///  5. `allreduce(in, out, op)` / `allreduce(buf, op)`: every rank gets the reduction; results
///     are bitwise identical on all ranks.
///  6. `reduce_scatter(in, out, op)`: `in` holds size() blocks of `out.size()` elements; rank r
///     gets the reduction of block r. In place, `reduce_scatter(buf, op)` leaves it in block r.
///  7. `allgather(in, out)`: `out` is size() blocks; block r is rank r's `in`. In place,
///     `allgather(buf)` expects each rank's contribution already in its block r.
///  8. `gather(in, out, root)` / `scatter(in, out, root)`: blocks to and from the root; the
///     root-side buffer is ignored on other ranks.
///  9. `alltoall(in, out)`: block j of rank i's `in` becomes block i of rank j's `out`.
///  10. `barrier()`: returns on a rank only after every rank has entered it.
///  11. Every operation has a throwing form and a noexcept form taking `std::error_code&`.
///  Semantics:
///  - Every rank calls the same operations in the same order with the same counts, type, op and
///    root. A rank that detects a different collective raises `errc::collective_mismatch` naming
///    both; one that waits past the communicator's timeout raises `errc::timeout` naming the
///    operation, its sequence number and the peer it waited for.
///  - Blocking: each call returns when this rank's part is done and its buffers may be reused.
///  - Thread safety: one call at a time per collective object (like an MPI communicator); use
///    one object per thread of communication.
///  - Buffers must not overlap except in the in-place forms.
///  - After an error the object is broken (`errc::broken`); build a new one.
///  A minimal model: tests/archetypes/archetypes.hpp `collective_archetype`.
template <class C, class T = float>
concept collective = element<T> && group_member<C> && requires { typename C::memory_space; } &&
                     rooted_data_collective<C, T> && reducing_collective<C, T> &&
                     exchanging_collective<C, T> && requires(C& c, std::error_code& ec) {
                       { c.barrier() } -> std::same_as<void>;
                       { c.barrier(ec) } noexcept -> std::same_as<void>;
                     };

}  // namespace dtrain
