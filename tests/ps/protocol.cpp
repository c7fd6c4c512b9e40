// The parameter server's messages: what is encoded decodes to the same, and every malformed
// request is a protocol error saying what is wrong (never a read past the end).

#include <cstdint>
#include <string>
#include <vector>

#include "../catch.hpp"
#include "dtrain/ps/protocol.hpp"

using namespace dtrain;
using namespace dtrain::ps;

namespace {
std::vector<std::byte> copy(const message& m) { return {m.bytes().begin(), m.bytes().end()}; }

std::string decode_error(const std::vector<std::byte>& b) {
  try {
    decode_request<float>(b, 7);
  } catch (const dtrain::error& e) {
    CHECK(e.code() == errc::protocol_error);
    return e.what();
  }
  return "no error";
}
}  // namespace

TEST_CASE("ps protocol: requests and responses round-trip", "[ps][protocol]") {
  request_header h{op::push, table_id::dense, 42, 17, 9, 0, 2, 3};
  const std::vector<std::uint64_t> keys{1, 5, 1ull << 40};
  const std::vector<float> values{1, 2, 3, 4, 5, 6};
  const auto bytes = copy(encode_request<float>(h, keys, values));
  CHECK(bytes.size() == header_bytes + 3 * 8 + 6 * 4);
  const auto r = decode_request<float>(bytes, 7);
  CHECK(r.header.what == op::push);
  CHECK(r.header.table == table_id::dense);
  CHECK(r.header.id == 42);
  CHECK(r.header.clock == 17);
  CHECK(r.header.basis == 9);
  CHECK(r.header.length == 2);
  CHECK(r.header.worker == 3);
  CHECK(r.keys == keys);
  REQUIRE(r.values.size() == 24);

  response_header rh{op::pull, 0, 42, 100, 5, 0, 1};
  message m = response_with_room<float>(rh, 3);
  m.values<float>()[2] = 2.5f;
  const auto rb = copy(m);
  const auto back = decode_response(rb, 1);
  CHECK(back.id == 42);
  CHECK(back.version == 100);
  CHECK(back.slowest == 5);
  CHECK(back.values == 3);
  CHECK(back.server == 1);
  const auto err = copy(encode_error(rh, errc::invalid_argument, "no such key"));
  CHECK(decode_response(err, 1).status == static_cast<std::uint8_t>(errc::invalid_argument));
}

TEST_CASE("ps protocol: malformed requests are refused, saying what is wrong", "[ps][protocol]") {
  request_header h{op::push, table_id::sparse, 1, 0, 0, 0, 1, 0};
  const std::vector<std::uint64_t> keys{1, 2};
  const std::vector<float> values{1, 2};
  const auto good = copy(encode_request<float>(h, keys, values));
  CHECK(decode_error(good) == "no error");
  CHECK_THAT(decode_error(std::vector<std::byte>(good.begin(), good.begin() + 20)),
             Catch::Contains("shorter than a header"));
  auto bad = good;
  bad[0] = std::byte{0};
  CHECK_THAT(decode_error(bad), Catch::Contains("wrong magic"));
  bad = good;
  bad[4] = std::byte{99};
  CHECK_THAT(decode_error(bad), Catch::Contains("unknown op 99"));
  bad = good;
  bad[5] = std::byte{7};
  CHECK_THAT(decode_error(bad), Catch::Contains("unknown table 7"));
  bad = good;
  bad[32] = std::byte{0xff};  // key count 255
  CHECK_THAT(decode_error(bad), Catch::Contains("255 keys in 24 bytes"));
  bad = good;
  for (int i = 32; i < 40; ++i) bad[static_cast<std::size_t>(i)] = std::byte{0xff};  // 2^64 - 1 keys
  CHECK_THAT(decode_error(bad), Catch::Contains("keys in 24 bytes"));
  bad = good;
  bad.pop_back();  // a value cut short
  CHECK_THAT(decode_error(bad), Catch::Contains("not whole elements"));
  bad = good;
  bad[40] = std::byte{2};  // length 2: 2 values cannot be 2 keys of length 2
  CHECK_THAT(decode_error(bad), Catch::Contains("2 values for 2 keys of length 2"));
  CHECK_THAT(decode_error(std::vector<std::byte>{}), Catch::Contains("from rank 7"));
}

TEST_CASE("ps protocol: key cache fields, a request that uses cached keys carries none", "[ps][protocol]") {
  request_header h{op::push_pull, table_id::sparse, 5, 0, 0, 3, 2, 1, key_cache::use, 7};
  const std::vector<float> values{1, 2, 3, 4, 5, 6};
  const auto bytes = copy(encode_request<float>(h, {}, values));
  CHECK(bytes.size() == header_bytes + 6 * 4);
  const auto r = decode_request<float>(bytes, 7);
  CHECK(r.header.what == op::push_pull);
  CHECK(r.header.cache == key_cache::use);
  CHECK(r.header.cache_slot == 7);
  CHECK(r.header.keys == 3);
  CHECK(r.keys.empty());
  CHECK(r.values.size() == 24);

  request_header s{op::pull, table_id::sparse, 6, 0, 0, 0, 1, 1, key_cache::store, 200};
  const std::vector<std::uint64_t> keys{1, 2};
  const auto stored = decode_request<float>(copy(encode_request<float>(s, keys, std::span<const float>{})), 7);
  CHECK(stored.header.cache == key_cache::store);
  CHECK(stored.header.cache_slot == 200);
  CHECK(stored.keys == keys);

  auto bad = bytes;
  bad[6] = std::byte{3};
  CHECK_THAT(decode_error(bad), Catch::Contains("unknown key cache mode 3"));
  bad = bytes;
  bad[32] = std::byte{4};  // 4 cached keys of length 2, but 6 values
  CHECK_THAT(decode_error(bad), Catch::Contains("6 values for 4 keys of length 2"));
  request_header hello{op::hello, table_id::sparse, 1, 0, 0, 0, 0, 0, key_cache::store, 0};
  CHECK_THAT(decode_error(copy(encode_request<float>(hello, keys, std::span<const float>{}))),
             Catch::Contains("key cache on a request without keys"));
}
