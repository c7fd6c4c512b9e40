#pragma once
/// @file
/// `user_op<T>(f)`: a reduction operator the user writes (MPI_Op_create, a custom ncclRedOp),
/// passed where a `reduce_op` goes in allreduce, reduce and reduce_scatter.
///
/// <!-- frame: header_inproc_comm -->
/// @code
/// auto gcd = dtrain::user_op<std::int64_t>([](std::int64_t a, std::int64_t b) { return std::gcd(a, b); });
/// comm.allreduce(std::span(values), gcd);
/// @endcode
///
/// `f` must be associative and commutative: every algorithm combines contributions in its own
/// order (ring by block, trees by subtree), as MPI assumes of an operator created "commutative".
/// Messages carry `reduce_op::custom`, so a rank calling a built-in operator where another calls
/// a user's is a collective mismatch; two different user operators are not told apart.

#include <concepts>
#include <cstddef>
#include <span>
#include <type_traits>

#include "dtrain/concepts/element.hpp"
#include "dtrain/core/config.hpp"
#include "dtrain/core/memory_space.hpp"
#include "dtrain/core/reduce_op.hpp"

namespace dtrain {

/// A user's binary operator on elements of `T`.
template <element T, class F>
  requires std::is_invocable_r_v<T, const F&, T, T>
struct user_reduce_op {
  F combine;
};

/// Wraps `f(T, T) -> T` as a reduction operator for elements of `T`.
template <element T, class F>
  requires std::is_invocable_r_v<T, const F&, T, T>
user_reduce_op<T, F> user_op(F f) {
  return {std::move(f)};
}

namespace detail {

/// A user's operator as a `reduction` over host memory: dst[i] = f(dst[i], src[i]).
template <class T, class F>
struct user_reduction {
  using memory_space = host_memory;
  const F* f;

  template <element U>
  void operator()(std::span<U> dst, std::span<const U> src, reduce_op) const {
    static_assert(std::is_same_v<U, T>, "a user_op reduces only the element type it was written for");
    DTRAIN_ASSERT(dst.size() == src.size(), "reduction of buffers of different sizes");
    for (std::size_t i = 0; i < dst.size(); ++i) dst[i] = (*f)(dst[i], src[i]);
  }
  // Never called: a user's operator is never `avg`.
  template <element U>
  void finish_average(std::span<U>, int) const noexcept {}
};

}  // namespace detail
}  // namespace dtrain
