#pragma once
/// @file
/// The `completion` concept: the handle of a non-blocking operation.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <system_error>

#include "dtrain/core/deadline.hpp"
#include "dtrain/core/signature.hpp"

namespace dtrain {

/// Receives may name this instead of a peer to accept a message from any rank.
inline constexpr int any_peer = -1;

/// What a completed operation moved: the peer, the tag, the signature the sender attached and the
/// payload size in bytes. For a receive from `any_peer`, `peer` is the rank that sent it.
struct envelope {
  int peer = any_peer;
  std::uint64_t tag = 0;
  signature sig{};
  std::size_t bytes = 0;
};

/// A completion is the handle of one non-blocking send or receive.
///  1. `r.wait(deadline, ec)` blocks until the operation completes or the deadline passes;
///     it returns true on success and false with `ec` set otherwise (`errc::timeout`,
///     `errc::peer_lost`, `errc::message_truncated`, `errc::cancelled`). noexcept.
///  2. `r.wait(deadline)` is the throwing form: it raises `dtrain::error` naming the operation
///     (send or receive), the peer and the tag.
///  3. `r.test()` returns true once the operation has finished, successfully or not. noexcept,
///     never blocks.
///  4. `r.cancel()` withdraws an operation that has not matched yet; an operation whose data is
///     being copied completes first. After `cancel()` returns the buffer is no longer referenced.
///     noexcept.
///  5. `r.info()` is the operation's envelope; complete only after a successful wait. For a
///     truncated receive it still names the sender and signature, so the caller can report a
///     collective mismatch instead of a size error.
///  Semantics:
///  - Buffer lifetime: the buffer passed to the operation must stay valid until `wait` succeeds,
///    `test` returns true, or `cancel` returns. Destroying an unfinished handle cancels it.
///  - Thread safety: one handle is used by one thread at a time; different handles may be waited
///    on concurrently.
///  - A handle is movable, not copyable; a moved-from handle is finished and empty.
///  A minimal model: tests/archetypes/archetypes.hpp `completion_archetype`.
template <class R>
concept completion =
    std::movable<R> &&
    requires(R& r, const R& cr, deadline d, std::error_code& ec) {
      { r.wait(d, ec) } noexcept -> std::same_as<bool>;
      { r.wait(d) } -> std::same_as<void>;
      { r.test() } noexcept -> std::same_as<bool>;
      { r.cancel() } noexcept;
      { cr.info() } noexcept -> std::convertible_to<const envelope&>;
    };

}  // namespace dtrain
