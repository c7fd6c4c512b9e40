#pragma once
/// @file
/// The element types dtrain moves and reduces, and their run-time tags.
///
/// float32, float64, int32, int64, uint8 and int8 are the arithmetic types; `float16` and
/// `bfloat16` are 16-bit storage types (for compressed buckets) that reduce by widening to float,
/// combining and rounding back to nearest-even. `bool` reduces as logic (sum and max are "or",
/// prod and min are "and", as PyTorch's NCCL backend maps them); `std::byte` is raw bytes, which
/// collectives move (broadcast, gather, allgather, ... serialised objects) but never reduce.

#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <span>
#include <string_view>
#include <type_traits>

#include "dtrain/core/config.hpp"

namespace dtrain {

namespace detail {

// __builtin_bit_cast rather than std::bit_cast: the same code must compile in CUDA device code.

DTRAIN_HOST_DEVICE constexpr std::uint32_t float_bits(float f) noexcept {
  return __builtin_bit_cast(std::uint32_t, f);
}
DTRAIN_HOST_DEVICE constexpr float bits_float(std::uint32_t u) noexcept {
  return __builtin_bit_cast(float, u);
}

// IEEE binary32 -> binary16 with round-to-nearest-even; overflow goes to infinity, NaN stays NaN.
DTRAIN_HOST_DEVICE constexpr std::uint16_t float_to_half_bits(float f) noexcept {
  std::uint32_t x = float_bits(f);
  std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN; keep NaN quiet and non-zero
    return static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds past max
  if (abs < 0x38800000u) {  // result is subnormal or zero: shift in the implicit bit and round
    if (abs < 0x33000000u) return static_cast<std::uint16_t>(sign);  // below half the min subnormal
    std::uint32_t exp = abs >> 23;
    std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    std::uint32_t shift = 126u - exp;  // 14 + (112 - exp): aligns to the subnormal grid
    std::uint32_t half_mant = mant >> shift;
    std::uint32_t rest = mant & ((1u << shift) - 1u);
    std::uint32_t halfway = 1u << (shift - 1u);
    if (rest > halfway || (rest == halfway && (half_mant & 1u))) ++half_mant;
    return static_cast<std::uint16_t>(sign | half_mant);
  }
  std::uint32_t rebased = abs - 0x38000000u;  // exponent bias 127 -> 15
  std::uint32_t half = rebased >> 13;
  std::uint32_t rest = rebased & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // may carry into exponent
  return static_cast<std::uint16_t>(sign | half);
}

DTRAIN_HOST_DEVICE constexpr float half_bits_to_float(std::uint16_t h) noexcept {
  std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu) return bits_float(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return bits_float(sign);
    // Subnormal: value is mant * 2^-24, exact in binary32.
    float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

DTRAIN_HOST_DEVICE constexpr std::uint16_t float_to_bfloat16_bits(float f) noexcept {
  std::uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest even
  return static_cast<std::uint16_t>(x >> 16);
}

DTRAIN_HOST_DEVICE constexpr float bfloat16_bits_to_float(std::uint16_t b) noexcept {
  return bits_float(static_cast<std::uint32_t>(b) << 16);
}

}  // namespace detail

/// IEEE 754 binary16 storage. Converts to and from float; arithmetic happens in float.
struct float16 {
  std::uint16_t bits = 0;

  float16() = default;
  /// Rounds `f` to the nearest representable binary16 (ties to even).
  DTRAIN_HOST_DEVICE constexpr explicit float16(float f) noexcept
      : bits(detail::float_to_half_bits(f)) {}
  DTRAIN_HOST_DEVICE constexpr explicit operator float() const noexcept {
    return detail::half_bits_to_float(bits);
  }
  /// Bitwise equality (so +0 != -0 and NaN == NaN with the same payload), as a storage type.
  friend constexpr bool operator==(float16, float16) noexcept = default;
};

/// bfloat16 storage: the upper half of a binary32. Converts to and from float.
struct bfloat16 {
  std::uint16_t bits = 0;

  bfloat16() = default;
  /// Rounds `f` to the nearest representable bfloat16 (ties to even).
  DTRAIN_HOST_DEVICE constexpr explicit bfloat16(float f) noexcept
      : bits(detail::float_to_bfloat16_bits(f)) {}
  DTRAIN_HOST_DEVICE constexpr explicit operator float() const noexcept {
    return detail::bfloat16_bits_to_float(bits);
  }
  friend constexpr bool operator==(bfloat16, bfloat16) noexcept = default;
};

/// Run-time tag of an element type; travels in every message signature.
enum class dtype : std::uint8_t { float32, float64, int32, int64, float16, bfloat16, uint8, int8, boolean, byte };

/// The highest `dtype` value: frames carrying a larger one are malformed.
inline constexpr dtype last_dtype = dtype::byte;

/// @returns the name used in errors and bench tables ("float32", "int64", ...).
constexpr std::string_view dtype_name(dtype t) noexcept {
  switch (t) {
    case dtype::float32: return "float32";
    case dtype::float64: return "float64";
    case dtype::int32: return "int32";
    case dtype::int64: return "int64";
    case dtype::float16: return "float16";
    case dtype::bfloat16: return "bfloat16";
    case dtype::uint8: return "uint8";
    case dtype::int8: return "int8";
    case dtype::boolean: return "bool";
    case dtype::byte: return "byte";
  }
  return "unknown";
}

/// @returns the size in bytes of one element of type `t`.
constexpr std::size_t dtype_size(dtype t) noexcept {
  switch (t) {
    case dtype::float32: case dtype::int32: return 4;
    case dtype::float64: case dtype::int64: return 8;
    case dtype::float16: case dtype::bfloat16: return 2;
    case dtype::uint8: case dtype::int8: case dtype::boolean: case dtype::byte: return 1;
  }
  return 0;
}

/// Maps a C++ type to its `dtype`; specialised for exactly the supported element types.
template <class T>
struct dtype_of;
template <> struct dtype_of<float> { static constexpr dtype value = dtype::float32; };
template <> struct dtype_of<double> { static constexpr dtype value = dtype::float64; };
template <> struct dtype_of<std::int32_t> { static constexpr dtype value = dtype::int32; };
template <> struct dtype_of<std::int64_t> { static constexpr dtype value = dtype::int64; };
template <> struct dtype_of<float16> { static constexpr dtype value = dtype::float16; };
template <> struct dtype_of<bfloat16> { static constexpr dtype value = dtype::bfloat16; };
template <> struct dtype_of<std::uint8_t> { static constexpr dtype value = dtype::uint8; };
template <> struct dtype_of<std::int8_t> { static constexpr dtype value = dtype::int8; };
template <> struct dtype_of<bool> { static constexpr dtype value = dtype::boolean; };
template <> struct dtype_of<std::byte> { static constexpr dtype value = dtype::byte; };

template <class T>
inline constexpr dtype dtype_of_v = dtype_of<T>::value;

/// The type arithmetic on `T` is carried out in: `float` for the 16-bit storage types, `T` itself
/// otherwise.
template <class T>
struct compute_type { using type = T; };
template <> struct compute_type<float16> { using type = float; };
template <> struct compute_type<bfloat16> { using type = float; };

template <class T>
using compute_type_t = typename compute_type<T>::type;

/// `v` as a `To`, through `From`'s compute type: exact for the wider types, rounded to nearest
/// (ties to even) into the 16-bit ones.
template <class To, class From>
DTRAIN_HOST_DEVICE constexpr To element_cast(From v) noexcept {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else {
    return static_cast<To>(static_cast<compute_type_t<From>>(v));
  }
}

/// Copies `from` into `to` (as long), converting each element (`element_cast`).
template <class From, class To>
void convert(std::span<From> from, std::span<To> to) {
  std::transform(from.begin(), from.end(), to.begin(), [](From v) { return element_cast<std::remove_cv_t<To>>(v); });
}

/// Whether collectives may reduce `T`: every element type except raw bytes.
template <class T>
inline constexpr bool reducible_v = !std::is_same_v<T, std::byte>;

}  // namespace dtrain
