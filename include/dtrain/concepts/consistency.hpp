#pragma once
/// @file
/// The `consistency` concept: when a worker may go on, and when a server applies.

#include <concepts>
#include <cstdint>
#include <string_view>

namespace dtrain {

/// A consistency model decides how far workers may drift apart and when pushed updates apply.
/// Clocks count a worker's completed iterations, starting at 0.
///  1. `C::name` is a `std::string_view` ("bsp", "ssp", ...), used in logs and checkpoints.
///  2. `c.staleness_bound()` is the number of clocks a worker may run ahead of the slowest
///     worker: 0 for BSP, s for SSP(s), `unbounded` for ASP. constexpr-friendly, noexcept.
///  3. `c.may_advance(clock, slowest)` is true when a worker that finished clock `clock` may
///     start its next iteration while the slowest worker has finished `slowest`; i.e.
///     `clock - slowest <= staleness_bound()`. noexcept, pure.
///  4. `c.pushes_to_apply(workers)` is how many pushes of one round a server collects before it
///     applies them (averaged): `workers` for BSP, 1 for ASP and SSP, s for soft sync. Always in
///     [1, workers]. noexcept, pure.
///  5. `c.visible_clock(clock)`: a worker reading at clock `clock` is guaranteed to see every
///     update from clocks <= the returned value (`clock - s - 1` for SSP; -1 means none).
///  Semantics: a consistency object is a stateless policy (the clocks live in the server); it is
///  thread-safe and its answers depend only on its arguments. Determinism: under BSP the order
///  in which pushes are applied is fixed by the server (worker id order), so runs repeat.
///  A minimal model: tests/archetypes/archetypes.hpp `consistency_archetype`.
template <class C>
concept consistency = std::semiregular<C> &&
                      requires(const C& c, std::int64_t clock, std::int64_t slowest, int workers) {
                        { C::name } -> std::convertible_to<std::string_view>;
                        { c.staleness_bound() } noexcept -> std::same_as<std::int64_t>;
                        { c.may_advance(clock, slowest) } noexcept -> std::same_as<bool>;
                        { c.pushes_to_apply(workers) } noexcept -> std::same_as<int>;
                        { c.visible_clock(clock) } noexcept -> std::same_as<std::int64_t>;
                      };

}  // namespace dtrain
