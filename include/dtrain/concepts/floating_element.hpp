#pragma once
/// @file
/// The `floating_element` concept: the types a model's parameters and gradients may have.

#include <concepts>

#include "dtrain/concepts/element.hpp"

namespace dtrain {

/// A floating-point `element`: `float` and `double`, which compute in themselves, and the 16-bit
/// `float16` and `bfloat16`, which compute in `float` (`compute_type_t`). A model of a 16-bit
/// type trains in mixed precision: a sharded trainer keeps its master parameters and optimizer
/// state in the compute type (docs/sharded.md).
///  A minimal model: `bfloat16`; a rejected type: `std::int32_t`, `long double` (no tag).
template <class T>
concept floating_element = element<T> && std::floating_point<compute_type_t<T>>;

}  // namespace dtrain
