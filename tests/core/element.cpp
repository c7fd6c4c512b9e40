#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "../catch.hpp"
#include "dtrain/core/element.hpp"

using dtrain::bfloat16;
using dtrain::float16;

namespace {
std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Reference bfloat16 rounding written from the definition: of the two bfloat16 neighbours of f
// (truncation and the next one up in magnitude), take the nearer; on a tie, the even one.
std::uint16_t reference_bf16(float f) {
  std::uint32_t u = bits_of(f);
  std::uint16_t lo = static_cast<std::uint16_t>(u >> 16);
  std::uint16_t hi = static_cast<std::uint16_t>(lo + 1);
  double d = f;
  double dlo = float_of(static_cast<std::uint32_t>(lo) << 16);
  double dhi = float_of(static_cast<std::uint32_t>(hi) << 16);
  double elo = std::fabs(d - dlo);
  double ehi = std::fabs(dhi - d);
  if (elo < ehi) return lo;
  if (ehi < elo) return hi;
  return (lo & 1u) ? hi : lo;
}
}  // namespace

TEST_CASE("float16: every binary16 value round-trips through float", "[core][element]") {
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    float16 h;
    h.bits = static_cast<std::uint16_t>(b);
    float f = static_cast<float>(h);
    bool nan = ((b >> 10) & 0x1fu) == 0x1fu && (b & 0x3ffu) != 0;
    if (nan) {
      REQUIRE(std::isnan(f));
      REQUIRE(std::isnan(static_cast<float>(float16(f))));
      continue;
    }
    REQUIRE(float16(f).bits == h.bits);
#if defined(__FLT16_MAX__)
    // The compiler's own _Float16 is an independent reference for the value.
    _Float16 native;
    std::uint16_t raw = static_cast<std::uint16_t>(b);
    std::memcpy(&native, &raw, 2);
    REQUIRE(bits_of(f) == bits_of(static_cast<float>(native)));
#endif
  }
}

TEST_CASE("float16: rounding of floats matches the compiler's _Float16", "[core][element]") {
#if defined(__FLT16_MAX__)
  std::mt19937 gen(7);
  std::uniform_int_distribution<std::uint32_t> any;
  for (int i = 0; i < 2'000'000; ++i) {
    float f = float_of(any(gen));
    if (std::isnan(f)) continue;
    _Float16 native = static_cast<_Float16>(f);
    std::uint16_t expect;
    std::memcpy(&expect, &native, 2);
    INFO("float bits " << bits_of(f));
    REQUIRE(float16(f).bits == expect);
  }
#else
  SUCCEED("no _Float16 on this compiler; covered by the round-trip test");
#endif
}

TEST_CASE("float16: edge cases", "[core][element]") {
  CHECK(float16(65504.0f).bits == 0x7bffu);                  // largest finite
  CHECK(float16(65520.0f).bits == 0x7c00u);                  // rounds to infinity
  CHECK(float16(5.9604644775390625e-8f).bits == 0x0001u);    // smallest subnormal
  CHECK(float16(2.98023223876953125e-8f).bits == 0x0000u);   // half of it: tie to even (zero)
  CHECK(float16(-0.0f).bits == 0x8000u);
  CHECK(float16(1.0f + 1.0f / 2048).bits == 0x3c00u);        // tie rounds to even
  CHECK(float16(1.0f + 3.0f / 2048).bits == 0x3c02u);
  CHECK(std::isinf(static_cast<float>(float16(std::numeric_limits<float>::infinity()))));
}

TEST_CASE("bfloat16: rounding matches the nearest-even definition", "[core][element]") {
  std::mt19937 gen(11);
  std::uniform_int_distribution<std::uint32_t> any;
  for (int i = 0; i < 2'000'000; ++i) {
    float f = float_of(any(gen));
    if (std::isnan(f) || std::isinf(f)) continue;
    if (std::fabs(f) > 3.3e38f) continue;  // the reference's upper neighbour would be infinity
    INFO("float bits " << bits_of(f));
    REQUIRE(bfloat16(f).bits == reference_bf16(f));
  }
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    bfloat16 x;
    x.bits = static_cast<std::uint16_t>(b);
    float f = static_cast<float>(x);
    if (std::isnan(f)) {
      REQUIRE(std::isnan(static_cast<float>(bfloat16(f))));
    } else {
      REQUIRE(bfloat16(f).bits == x.bits);
    }
  }
}

TEST_CASE("dtype tags and sizes agree with the C++ types", "[core][element]") {
  using dtrain::dtype;
  using dtrain::dtype_of_v;
  using dtrain::dtype_size;
  STATIC_REQUIRE(dtype_size(dtype_of_v<float>) == sizeof(float));
  STATIC_REQUIRE(dtype_size(dtype_of_v<double>) == sizeof(double));
  STATIC_REQUIRE(dtype_size(dtype_of_v<std::int32_t>) == 4);
  STATIC_REQUIRE(dtype_size(dtype_of_v<std::int64_t>) == 8);
  STATIC_REQUIRE(dtype_size(dtype_of_v<float16>) == sizeof(float16));
  STATIC_REQUIRE(dtype_size(dtype_of_v<bfloat16>) == sizeof(bfloat16));
  CHECK(dtrain::dtype_name(dtype::bfloat16) == "bfloat16");
}
