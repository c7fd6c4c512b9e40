// libFuzzer target: the decoders that read bytes from the network before anyone is
// authenticated or trusted: frame headers, handshake hellos and handshake challenges.
// Properties: never crash, never read out of bounds (ASan), never hit UB (UBSan); anything a
// decoder accepts re-encodes to the same bytes.
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude frame_decoder.cpp

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "dtrain/core/frame.hpp"
#include "dtrain/net/auth.hpp"
#include "dtrain/rendezvous/store.hpp"

namespace {

[[noreturn]] void property_failed() { std::abort(); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto bytes = std::span(reinterpret_cast<const std::byte*>(data), size);
  // Frame headers: any prefix length (short reads), any expected sequence and size limit.
  std::uint64_t seq = size >= 17 ? static_cast<std::uint64_t>(data[16]) : 0;
  std::uint64_t max = size >= 25 ? (std::uint64_t{1} << (data[24] % 40)) : 1024;
  auto r = dtrain::decode_frame(bytes.first(std::min<std::size_t>(size, dtrain::frame_header::size)), seq, max);
  if (r.ok) {
    auto again = dtrain::encode_frame(r.header);
    if (std::memcmp(again.data(), data, dtrain::frame_header::size) != 0) property_failed();
    if (r.header.length > max || r.header.seq != seq) property_failed();
  } else if (r.error.empty()) {
    property_failed();  // every refusal says why
  }
  // Handshake messages.
  if (size >= dtrain::detail::auth::hello::size) {
    dtrain::detail::auth::hello_bytes h{};
    std::memcpy(h.data(), data, h.size());
    if (auto hello = dtrain::detail::auth::decode(h)) {
      if (dtrain::detail::auth::encode(*hello) != h) property_failed();
    }
  }
  if (size >= dtrain::detail::auth::challenge::size) {
    dtrain::detail::auth::challenge_bytes c{};
    std::memcpy(c.data(), data, c.size());
    auto decoded = dtrain::detail::auth::decode(c);
    for (char ch : decoded.reason) {
      if (ch < ' ' || ch > '~') property_failed();  // peer text is made printable
    }
  }
  return 0;
}
