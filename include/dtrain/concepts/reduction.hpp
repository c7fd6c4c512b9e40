#pragma once
/// @file
/// The `reduction` concept: element-wise combining of one buffer into another.

#include <concepts>
#include <span>

#include "dtrain/concepts/element.hpp"
#include "dtrain/core/memory_space.hpp"
#include "dtrain/core/reduce_op.hpp"

namespace dtrain {

/// A reduction combines a source buffer into a destination buffer element by element.
///  1. `r(dst, src, op)` sets `dst[i] = combine(op, dst[i], src[i])` for every i; `avg` combines
///     as `sum` (the division happens once, at the end of a collective).
///  2. `r.finish_average(buf, n)` divides every element by `n` (see `reduce_op::avg`).
///  3. `R::memory_space` is where `dst` and `src` must live; they are `span_in<R::memory_space, T>`
///     (`std::span` on the host, `device_span` on the device).
///  Semantics: `dst` and `src` have equal sizes and do not overlap. Results are deterministic:
///  the same inputs give the same bits on every call (no reassociation across elements matters,
///  since each element is combined once). Thread-safe: a reduction object holds no mutable state.
///  Models: `host_reduction` (vectorised loops), `thrust_reduction` (Thrust CPP/OMP/CUDA).
template <class R, class T = float>
concept reduction = element<T> && std::copyable<R> && requires { typename R::memory_space; } &&
                    requires(const R& r, span_in<typename R::memory_space, T> dst,
                             span_in<typename R::memory_space, const T> src, reduce_op op, int n) {
                      { r(dst, src, op) } -> std::same_as<void>;
                      { r.finish_average(dst, n) } -> std::same_as<void>;
                    };

}  // namespace dtrain
