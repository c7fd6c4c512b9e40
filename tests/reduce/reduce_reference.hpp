#pragma once
// A reduction model is checked against the plain scalar definition of each operator, computed
// in double / int64 and rounded to the element type once.

#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <type_traits>
#include <vector>

#include "../catch.hpp"
#include "dtrain/core/element.hpp"
#include "dtrain/core/reduce_op.hpp"

namespace dtrain::test {

template <class T>
using wide_t = std::conditional_t<std::is_integral_v<T>, std::int64_t, double>;

template <class T>
wide_t<T> reference_combine(reduce_op op, wide_t<T> a, wide_t<T> b) {
  switch (op) {
    case reduce_op::sum:
    case reduce_op::avg: return a + b;
    case reduce_op::prod: return a * b;
    case reduce_op::min: return std::min(a, b);
    case reduce_op::max: return std::max(a, b);
    case reduce_op::band:
    case reduce_op::bor:
    case reduce_op::bxor:
      if constexpr (std::is_integral_v<wide_t<T>>)
        return op == reduce_op::band ? (a & b) : op == reduce_op::bor ? (a | b) : (a ^ b);
      break;  // refused for floating-point types
    case reduce_op::custom: break;  // not a built-in operator
  }
  return 0;
}

template <class T>
bool same_bits(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    return std::memcmp(&a, &b, sizeof(T)) == 0;
  } else {
    return a == b;
  }
}

template <class T, class Reduction>
void check_reduction_for(const Reduction& reduce) {
  std::mt19937 gen(3);
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000},
                        std::size_t{65537}}) {
    for (reduce_op op : {reduce_op::sum, reduce_op::prod, reduce_op::min, reduce_op::max, reduce_op::avg,
                         reduce_op::band, reduce_op::bor, reduce_op::bxor}) {
      if (is_bitwise(op) && !bitwise_reducible_v<T>) continue;
      // Small integers: every result is exact in every type, so it must match bit for bit.
      std::uniform_int_distribution<int> dist(-50, 50);
      std::vector<T> dst(n), src(n);
      for (std::size_t i = 0; i < n; ++i) {
        int a = dist(gen), b = dist(gen);
        if (op == reduce_op::prod) { a %= 10; b %= 10; }
        dst[i] = static_cast<T>(static_cast<compute_type_t<T>>(a));
        src[i] = static_cast<T>(static_cast<compute_type_t<T>>(b));
      }
      std::vector<T> expect(n);
      for (std::size_t i = 0; i < n; ++i) {
        auto a = static_cast<wide_t<T>>(static_cast<compute_type_t<T>>(dst[i]));
        auto b = static_cast<wide_t<T>>(static_cast<compute_type_t<T>>(src[i]));
        expect[i] = static_cast<T>(static_cast<compute_type_t<T>>(reference_combine<T>(op, a, b)));
      }
      reduce(std::span<T>(dst), std::span<const T>(src), op);
      for (std::size_t i = 0; i < n; ++i) {
        if (!(dst[i] == expect[i])) {
          FAIL("type " << dtype_name(dtype_of_v<T>) << " op " << reduce_op_name(op) << " n " << n
                       << " index " << i);
        }
      }
    }
    // finish_average divides once, in the compute type.
    std::vector<T> buf(n);
    for (std::size_t i = 0; i < n; ++i) buf[i] = static_cast<T>(static_cast<compute_type_t<T>>(int(i % 97) - 48));
    std::vector<T> expect(n);
    for (std::size_t i = 0; i < n; ++i) {
      auto v = static_cast<compute_type_t<T>>(buf[i]);
      expect[i] = static_cast<T>(static_cast<compute_type_t<T>>(v / static_cast<compute_type_t<T>>(3)));
    }
    reduce.finish_average(std::span<T>(buf), 3);
    for (std::size_t i = 0; i < n; ++i) REQUIRE(buf[i] == expect[i]);
  }
  SUCCEED();
}

template <class Reduction>
void check_reduction(const Reduction& reduce) {
  check_reduction_for<float>(reduce);
  check_reduction_for<double>(reduce);
  check_reduction_for<std::int32_t>(reduce);
  check_reduction_for<std::int64_t>(reduce);
  check_reduction_for<float16>(reduce);
  check_reduction_for<bfloat16>(reduce);
}

}  // namespace dtrain::test
