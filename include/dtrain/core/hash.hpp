#pragma once
/// @file
/// The two hashes dtrain uses wherever every process must compute the same value: splitmix64,
/// to mix keys and seeds (sharding, initializers, shuffles), and FNV-1a, to digest configurations
/// and files (bucket plans, hellos, checkpoint checksums). Both are fixed by their definitions,
/// independent of the standard library and the platform.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace dtrain {

/// splitmix64 (Steele, Lea and Flood 2014): adds the golden-ratio increment to `z`, then mixes.
/// Bijective; a counter run through it is a good pseudo-random sequence.
constexpr std::uint64_t splitmix64(std::uint64_t z) noexcept {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// 64-bit FNV-1a, fed bytes, 64-bit words (as their 8 little-endian bytes) or text.
class fnv1a {
 public:
  constexpr fnv1a& byte(std::uint8_t b) noexcept {
    h_ = (h_ ^ b) * 0x100000001b3ull;
    return *this;
  }
  constexpr fnv1a& bytes(std::span<const std::byte> b) noexcept {
    for (std::byte x : b) byte(static_cast<std::uint8_t>(x));
    return *this;
  }
  constexpr fnv1a& word(std::uint64_t v) noexcept {
    for (int i = 0; i < 8; ++i) byte(static_cast<std::uint8_t>(v >> (8 * i)));
    return *this;
  }
  constexpr fnv1a& text(std::string_view s) noexcept {
    for (char c : s) byte(static_cast<std::uint8_t>(c));
    return *this;
  }
  constexpr std::uint64_t value() const noexcept { return h_; }

 private:
  std::uint64_t h_ = 0xcbf29ce484222325ull;
};

}  // namespace dtrain
