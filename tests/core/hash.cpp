// The shared hashes against their published values, so every process and release agrees.

#include <array>
#include <cstddef>

#include "../catch.hpp"
#include "dtrain/core/hash.hpp"

TEST_CASE("splitmix64 and FNV-1a give their reference values", "[core][hash]") {
  // splitmix64's first outputs from seed 0 (Vigna's reference implementation).
  CHECK(dtrain::splitmix64(0) == 0xe220a8397b1dcdafull);
  CHECK(dtrain::splitmix64(0x9e3779b97f4a7c15ull) == 0x6e789e6aa1b965f4ull);
  // FNV-1a 64: the offset basis, and "a" and "foobar" from the FNV test vectors.
  CHECK(dtrain::fnv1a().value() == 0xcbf29ce484222325ull);
  CHECK(dtrain::fnv1a().text("a").value() == 0xaf63dc4c8601ec8cull);
  CHECK(dtrain::fnv1a().text("foobar").value() == 0x85944171f73967e8ull);
  // A word is its 8 little-endian bytes.
  const std::array<std::byte, 8> le{std::byte{0x08}, std::byte{0x07}, std::byte{0x06}, std::byte{0x05},
                                    std::byte{0x04}, std::byte{0x03}, std::byte{0x02}, std::byte{0x01}};
  CHECK(dtrain::fnv1a().word(0x0102030405060708ull).value() == dtrain::fnv1a().bytes(le).value());
}
