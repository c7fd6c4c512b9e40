#pragma once
/// @file
/// The `element` concept: a type dtrain can move, reduce and tag on the wire.

#include <concepts>
#include <type_traits>

#include "dtrain/core/element.hpp"

namespace dtrain {

/// An element is a value type that collectives move and reduce.
///  1. `dtype_of<T>::value` names its run-time tag (float32, float64, int32, int64, float16,
///     bfloat16); the tag travels in every message signature.
///  2. It is trivially copyable and its size is `dtype_size(dtype_of_v<T>)`, so its bytes can be
///     sent as they are between ranks of the same architecture (little-endian everywhere dtrain
///     runs).
///  3. `compute_type_t<T>` is the type arithmetic is done in; `T` converts to and from it
///     (explicitly is enough).
///  Semantics: elements have no identity or state; equal bits mean equal values for reductions.
///  A minimal model: `float`; a rejected type: `char` (no tag), `std::string` (not trivial).
template <class T>
concept element = requires { { dtype_of<T>::value } -> std::convertible_to<dtype>; } &&
                  std::is_trivially_copyable_v<T> &&
                  sizeof(T) == dtype_size(dtype_of<T>::value) &&
                  requires(T t, compute_type_t<T> c) {
                    static_cast<compute_type_t<T>>(t);  // explicit is enough: float16 -> float
                    static_cast<T>(c);
                  };

}  // namespace dtrain
