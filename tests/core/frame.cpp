// The wire frame header: every field round-trips; every malformed field is refused with a
// message that names it.

#include <random>

#include "../catch.hpp"
#include "dtrain/core/frame.hpp"

using namespace dtrain;

namespace {

frame_header sample() {
  frame_header h;
  h.kind = frame_kind::data;
  h.tag = 0x0123456789abcdefULL;
  h.seq = 41;
  h.length = 1 << 20;
  h.sig = signature{coll_op::allreduce, algorithm::ring, dtype::bfloat16, reduce_op::max, -1, 12345, 9};
  return h;
}

}  // namespace

TEST_CASE("frame: every field round-trips, little-endian", "[frame]") {
  frame_header h = sample();
  frame_bytes b = encode_frame(h);
  CHECK(std::to_integer<int>(b[0]) == 'D');
  CHECK(std::to_integer<int>(b[3]) == 'N');
  CHECK(std::to_integer<int>(b[16]) == 41);  // seq, low byte first
  auto r = decode_frame(b, 41, 1 << 20);
  INFO(r.error);
  REQUIRE(r.ok);
  CHECK(r.header == h);
}

TEST_CASE("frame: malformed headers are refused with the field named", "[frame]") {
  const frame_bytes good = encode_frame(sample());
  auto refused = [](frame_bytes b, std::uint64_t seq, std::uint64_t max, const std::string& word) {
    auto r = decode_frame(b, seq, max);
    INFO(r.error);
    CHECK_FALSE(r.ok);
    CHECK(r.error.find(word) != std::string::npos);
  };
  frame_bytes b = good;
  b[0] = std::byte{'X'};
  refused(b, 41, 1 << 20, "magic");
  b = good;
  b[4] = std::byte{2};
  refused(b, 41, 1 << 20, "version");
  b = good;
  b[6] = std::byte{9};
  refused(b, 41, 1 << 20, "kind");
  refused(good, 40, 1 << 20, "sequence");
  refused(good, 41, (1 << 20) - 1, "exceeds the maximum");
  b = good;
  b[32] = std::byte{200};
  refused(b, 41, 1 << 20, "signature");
  b = good;
  b[60] = std::byte{1};
  refused(b, 41, 1 << 20, "reserved");
  auto r = decode_frame(std::span<const std::byte>(good.data(), 63), 41, 1 << 20);
  CHECK_FALSE(r.ok);
}

TEST_CASE("frame: random bytes never decode as a frame by accident", "[frame]") {
  std::mt19937_64 rng(7);
  int accepted = 0;
  for (int i = 0; i < 100000; ++i) {
    frame_bytes b;
    for (auto& x : b) x = static_cast<std::byte>(rng());
    accepted += decode_frame(b, 0, std::uint64_t{1} << 30).ok ? 1 : 0;
  }
  CHECK(accepted == 0);
}
