#pragma once
/// @file
/// `host_reduction`: element-wise reductions on host memory, written so the compiler vectorises
/// them (one tight loop per operator and type, non-aliasing pointers, no branches inside).

#include <cstddef>
#include <span>
#include <type_traits>

#include "dtrain/concepts/element.hpp"
#include "dtrain/core/config.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/memory_space.hpp"
#include "dtrain/core/reduce_op.hpp"

#if defined(__F16C__) && defined(__FLT16_MAX__) && !defined(__CUDACC__)
#include <immintrin.h>
#endif

namespace dtrain {

namespace detail {

template <reduce_op Op, class T>
void combine_loop(T* DTRAIN_RESTRICT dst, const T* DTRAIN_RESTRICT src, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) dst[i] = combine_elements<Op>(dst[i], src[i]);
}

#if defined(__F16C__) && defined(__FLT16_MAX__) && !defined(__CUDACC__)
// With F16C the compiler converts binary16 in vector registers; the rounding is the same IEEE
// round-to-nearest-even as float16's own conversion, so results are bit-identical, only faster.
// may_alias: the buffers hold dtrain::float16 objects and are read through another type.
typedef _Float16 native_half __attribute__((may_alias));

template <reduce_op Op>
void combine_loop(float16* DTRAIN_RESTRICT dst, const float16* DTRAIN_RESTRICT src,
                  std::size_t n) noexcept {
  auto* d = reinterpret_cast<native_half*>(dst);
  const auto* s = reinterpret_cast<const native_half*>(src);
  std::size_t i = 0;
  if constexpr (Op == reduce_op::sum) {  // the gradient case, eight at a time
    for (; i + 8 <= n; i += 8) {
      const __m256 a = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dst + i)));
      const __m256 b = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                       _mm256_cvtps_ph(_mm256_add_ps(a, b), _MM_FROUND_TO_NEAREST_INT));
    }
  }
  for (; i < n; ++i) {
    d[i] = static_cast<native_half>(combine<Op>(static_cast<float>(d[i]), static_cast<float>(s[i])));
  }
}
#endif

/// dst[i] = Half(src[i] * scale): packs a buffer for a 16-bit reduction. @pre equal sizes
template <class Half, class T>
void pack_scaled(const T* DTRAIN_RESTRICT src, Half* DTRAIN_RESTRICT dst, std::size_t n, float scale) noexcept {
#if defined(__F16C__) && defined(__FLT16_MAX__) && !defined(__CUDACC__)
  if constexpr (std::is_same_v<Half, float16> && std::is_same_v<T, float>) {
    // Eight at a time with F16C; GCC leaves the _Float16 loop scalar.
    const __m256 k = _mm256_set1_ps(scale);
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(src + i), k), _MM_FROUND_TO_NEAREST_INT);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
    }
    for (; i < n; ++i) dst[i] = float16(src[i] * scale);
    return;
  }
#endif
  for (std::size_t i = 0; i < n; ++i) dst[i] = Half(static_cast<float>(src[i]) * scale);
}

/// dst[i] = T(src[i]): widens a 16-bit buffer back. @pre equal sizes
template <class Half, class T>
void unpack(const Half* DTRAIN_RESTRICT src, T* DTRAIN_RESTRICT dst, std::size_t n) noexcept {
#if defined(__F16C__) && defined(__FLT16_MAX__) && !defined(__CUDACC__)
  if constexpr (std::is_same_v<Half, float16> && std::is_same_v<T, float>) {
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
    }
    for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
    return;
  }
#endif
  for (std::size_t i = 0; i < n; ++i) dst[i] = static_cast<T>(static_cast<float>(src[i]));
}

}  // namespace detail

/// Reduces host buffers with vectorised loops (a model of `reduction`). With -O3 -march=native
/// it runs at the speed of a plain `a[i] += b[i]` loop: bench/host_reduce measures both.
struct host_reduction {
  using memory_space = host_memory;

  /// `dst[i] = op(dst[i], src[i])` (`avg` combines as sum). @pre equal sizes, no overlap.
  template <element T>
  void operator()(std::span<T> dst, std::span<const T> src, reduce_op op) const noexcept {
    DTRAIN_ASSERT(dst.size() == src.size(), "reduction of buffers of different sizes");
    T* d = dst.data();
    const T* s = src.data();
    std::size_t n = dst.size();
    switch (op) {
      case reduce_op::sum:
      case reduce_op::avg: detail::combine_loop<reduce_op::sum>(d, s, n); break;
      case reduce_op::prod: detail::combine_loop<reduce_op::prod>(d, s, n); break;
      case reduce_op::min: detail::combine_loop<reduce_op::min>(d, s, n); break;
      case reduce_op::max: detail::combine_loop<reduce_op::max>(d, s, n); break;
      case reduce_op::custom: DTRAIN_ASSERT(false, "a user's operator reduces through user_reduction"); break;
      case reduce_op::band:
      case reduce_op::bor:
      case reduce_op::bxor: bitwise(d, s, n, op); break;
    }
  }

  /// Divides every element of `buf` by `n`: the end of an `avg` reduction over n ranks.
  template <element T>
  void finish_average(std::span<T> buf, int n) const noexcept {
    for (T& x : buf) x = average_of_sum(x, n);
  }

 private:
  // The bitwise loops exist only for integers and bools; other types were refused before any
  // message moved (`refused_reduction`).
  template <element T>
  static void bitwise(T* d, const T* s, std::size_t n, reduce_op op) noexcept {
    if constexpr (bitwise_reducible_v<T>) {
      if (op == reduce_op::band) detail::combine_loop<reduce_op::band>(d, s, n);
      if (op == reduce_op::bor) detail::combine_loop<reduce_op::bor>(d, s, n);
      if (op == reduce_op::bxor) detail::combine_loop<reduce_op::bxor>(d, s, n);
    } else {
      DTRAIN_ASSERT(false, "bitwise operators on a type refused_reduction refuses");
    }
  }
};

}  // namespace dtrain
