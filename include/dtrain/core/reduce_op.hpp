#pragma once
/// @file
/// Reduction operators and their element-wise semantics.

#include <cstdint>
#include <string_view>
#include <type_traits>

#include "dtrain/core/config.hpp"
#include "dtrain/core/element.hpp"

namespace dtrain {

/// How a reduction combines the contributions of the ranks.
///
/// `avg` is a sum followed by one division by the number of contributions, done in the element's
/// compute type: float for float16/bfloat16, integer division (truncating toward zero) for int32
/// and int64. All operators are commutative and associative on integers; on floating-point types
/// results depend on the combining order, which each algorithm fixes (see docs/algorithms.md).
///
/// `band`, `bor` and `bxor` are bitwise and, or and xor (MPI_BAND, MPI_BOR, MPI_BXOR; Gloo's and
/// PyTorch's BAND, BOR, BXOR), for integers and bools only.
enum class reduce_op : std::uint8_t { sum, prod, min, max, avg, custom, band, bor, bxor };

/// The highest `reduce_op` value: frames carrying a larger one are malformed.
inline constexpr reduce_op last_reduce_op = reduce_op::bxor;

/// @returns "sum", "prod", "min", "max", "avg", "custom", "band", "bor" or "bxor".
constexpr std::string_view reduce_op_name(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum: return "sum";
    case reduce_op::prod: return "prod";
    case reduce_op::min: return "min";
    case reduce_op::max: return "max";
    case reduce_op::avg: return "avg";
    case reduce_op::custom: return "custom";
    case reduce_op::band: return "band";
    case reduce_op::bor: return "bor";
    case reduce_op::bxor: return "bxor";
  }
  return "unknown";
}

/// Whether `op` is one of the bitwise operators.
DTRAIN_HOST_DEVICE constexpr bool is_bitwise(reduce_op op) noexcept {  // device code asserts with it
  return op == reduce_op::band || op == reduce_op::bor || op == reduce_op::bxor;
}

/// Whether the bitwise operators reduce elements of type `T`: integers and bools.
template <class T>
inline constexpr bool bitwise_reducible_v = std::is_integral_v<T>;

/// The pairwise combining step of `op` in compute type `C` (`avg` combines as `sum`). 8-bit
/// integers wrap modulo 256 as in PyTorch; on `bool`, sum is "or" and prod is "and".
template <reduce_op Op, class C>
DTRAIN_HOST_DEVICE constexpr C combine(C a, C b) noexcept {
  if constexpr (std::is_same_v<C, bool> && (Op == reduce_op::sum || Op == reduce_op::avg)) {
    return a || b;
  } else if constexpr (std::is_same_v<C, bool> && Op == reduce_op::prod) {
    return a && b;
  } else if constexpr (Op == reduce_op::sum || Op == reduce_op::avg) {
    return static_cast<C>(a + b);
  } else if constexpr (Op == reduce_op::prod) {
    return static_cast<C>(a * b);
  } else if constexpr (Op == reduce_op::min) {
    return b < a ? b : a;
  } else if constexpr (Op == reduce_op::max) {
    return a < b ? b : a;
  } else {
    static_assert(is_bitwise(Op) && bitwise_reducible_v<C>, "bitwise operators reduce integers and bools only");
    if constexpr (Op == reduce_op::band) {
      return static_cast<C>(a & b);
    } else if constexpr (Op == reduce_op::bor) {
      return static_cast<C>(a | b);
    } else {
      return static_cast<C>(a ^ b);
    }
  }
}

/// Combines two elements of type `T` (widening 16-bit storage types to float and rounding back).
template <reduce_op Op, class T>
DTRAIN_HOST_DEVICE constexpr T combine_elements(T a, T b) noexcept {
  using C = compute_type_t<T>;
  return T(combine<Op>(C(a), C(b)));
}

/// Why the built-in operator `op` cannot reduce elements of type `T`, or nullptr when it can.
/// `custom` is only ever set by a user's operator (`user_op`); avg of bools has no meaning.
template <class T>
constexpr const char* refused_reduction(reduce_op op) noexcept {
  if (op == reduce_op::custom) return "reduce_op::custom is set by a user_op, not passed as an operator";
  if (std::is_same_v<T, bool> && op == reduce_op::avg) return "avg of bool has no meaning (sum is or, prod is and)";
  if (is_bitwise(op) && !bitwise_reducible_v<T>) return "bitwise and, or and xor reduce integers and bools only";
  return nullptr;
}

/// Turns a sum over `n` contributions into their average, in `T`'s compute type.
template <class T>
DTRAIN_HOST_DEVICE constexpr T average_of_sum(T sum, int n) noexcept {
  using C = compute_type_t<T>;
  return T(C(sum) / static_cast<C>(n));
}

}  // namespace dtrain
