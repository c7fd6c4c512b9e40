#pragma once
/// @file
/// The `updater` concept: how parameters change given their gradients.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace dtrain {

/// Per-step information an updater receives besides the gradient.
struct step_info {
  /// The update's measured staleness in clocks (0 for synchronous training). Plain updaters
  /// ignore it; `staleness_aware` divides the learning rate by it.
  std::uint64_t staleness = 0;
  /// A factor on the learning rate for this step (schedules, warm-up, staleness scaling).
  double lr_scale = 1.0;
  /// How many updates the tensor being stepped has had, this one included (1, 2, ...), from
  /// callers that count per tensor (the trainers); 0 where the caller does not count (the
  /// parameter server's keys). Updaters whose rule depends on it (`adam`) refuse 0.
  std::uint64_t step = 0;
};

/// An updater changes parameters from gradients and owns the per-parameter state it needs.
///  1. `U::name` is a `std::string_view` ("sgd", "adam", ...).
///  2. `U::state_slots` is how many values of state it keeps per parameter (0 for SGD, 2 for
///     momentum's velocity... see each model), stored interleaved: parameter i owns
///     `state()[i * state_slots, (i + 1) * state_slots)`.
///  3. `u.resize(n)` makes room for the state of `n` parameters: existing state is kept, new state
///     is zero. The parameter server calls it as keys appear.
///  4. `u.step(params, grads, offset, info)` applies one update to `params[i]` from `grads[i]`
///     using the state of parameter `offset + i`; sizes equal, `offset + size <= parameters()`.
///  5. `u.parameters()` is the number of parameters with state; `u.state()` views the state (for
///     checkpoints: write it out, read it back in).
///  6. `u.learning_rate()` / `u.set_learning_rate(lr)`: the base rate, for schedules.
///  Semantics: `step` is deterministic (same inputs and state give the same bits) and touches only
///  the state of the parameters it updates, so disjoint ranges may be stepped concurrently from
///  different threads; anything else needs external synchronisation.
///  A minimal model: tests/archetypes/archetypes.hpp `updater_archetype`.
template <class U, class T = float>
concept updater =
    std::movable<U> && std::floating_point<T> &&
    requires(U& u, const U& cu, std::span<T> params, std::span<const T> grads, std::size_t n,
             step_info info, double lr) {
      { U::name } -> std::convertible_to<std::string_view>;
      { U::state_slots } -> std::convertible_to<std::size_t>;
      { u.resize(n) } -> std::same_as<void>;
      { u.step(params, grads, n, info) } -> std::same_as<void>;
      { cu.parameters() } noexcept -> std::same_as<std::size_t>;
      { u.state() } noexcept -> std::same_as<std::span<T>>;
      { cu.learning_rate() } noexcept -> std::same_as<double>;
      { u.set_learning_rate(lr) } noexcept -> std::same_as<void>;
    };

}  // namespace dtrain
