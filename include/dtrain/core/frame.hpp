#pragma once
/// @file
/// The wire format of dtrain's byte transports: a fixed 64-byte frame header, little-endian.
///
/// | offset | size | field                                                          |
/// |-------:|-----:|----------------------------------------------------------------|
/// |      0 |    4 | magic "DTRN"                                                   |
/// |      4 |    2 | version (1)                                                    |
/// |      6 |    2 | kind: data, goodbye, goodbye_ack, abort, remote, remote_done   |
/// |      8 |    8 | tag (an abort frame's: `abort_tag`, what its reason reports)   |
/// |     16 |    8 | sequence number of the frame on its connection (0, 1, 2, ...) |
/// |     24 |    8 | payload length in bytes                                        |
/// |     32 |   24 | collective signature: op, algo, dtype, redop (1 each), root    |
/// |        |      | (4), count (8), collective sequence number (8)                 |
/// |     56 |    8 | reserved, zero                                                 |
///
/// The payload follows the header. `decode_frame` checks every field, so a stray or corrupted
/// stream is refused at its first header instead of being read as data.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "dtrain/core/error.hpp"
#include "dtrain/core/signature.hpp"

namespace dtrain {

/// What a frame carries. Control frames have no tag and no signature.
enum class frame_kind : std::uint16_t {
  data = 0,         ///< a message for the application
  goodbye = 1,      ///< the sender is shutting down after its last message
  goodbye_ack = 2,  ///< the receiver has read everything before the sender's goodbye
  abort = 3,        ///< the sender's group failed; the payload is the reason, as text
  remote = 4,       ///< shared memory: the payload stays in the sender's memory; its ranges follow
  remote_done = 5,  ///< shared memory: the receiver has copied the remote payload of frame `tag`
};

struct frame_header {
  static constexpr std::uint32_t magic = 0x4E525444;  // "DTRN" in memory order
  static constexpr std::uint16_t version = 1;
  static constexpr std::size_t size = 64;

  frame_kind kind = frame_kind::data;
  std::uint64_t tag = 0;
  std::uint64_t seq = 0;
  std::uint64_t length = 0;
  signature sig{};

  friend constexpr bool operator==(const frame_header&, const frame_header&) noexcept = default;
};

using frame_bytes = std::array<std::byte, frame_header::size>;

/// The most an abort frame's reason may hold; a longer one is a protocol error.
inline constexpr std::size_t max_abort_reason_bytes = 4096;

/// An abort frame's reason as text for an error message: a byte outside printable ASCII (a
/// peer's bytes reach users' logs) becomes '?'.
inline std::string abort_reason(std::span<const std::byte> payload) {
  std::string text(payload.size(), '?');
  for (std::size_t i = 0; i < payload.size(); ++i) {
    const auto c = static_cast<char>(payload[i]);
    if (c >= ' ' && c <= '~') text[i] = c;
  }
  return text;
}

/// An abort frame's tag says what its reason reports, so that every rank raises the code of the
/// rank that found the failure: a collective mismatch one rank finds is a mismatch on all, and so
/// is a job built differently on two ranks (`invalid_argument`). Any other value (0 included)
/// reads as a lost peer.
inline constexpr std::uint64_t abort_tag(errc code) noexcept {
  const bool told = code == errc::collective_mismatch || code == errc::invalid_argument;
  return told ? static_cast<std::uint64_t>(code) : 0;
}
inline constexpr errc abort_code(std::uint64_t tag) noexcept {
  if (tag == abort_tag(errc::collective_mismatch)) return errc::collective_mismatch;
  if (tag == abort_tag(errc::invalid_argument)) return errc::invalid_argument;
  return errc::peer_lost;
}

namespace detail::wire {

template <class U>
constexpr void put(std::byte* p, U v) noexcept {
  for (std::size_t i = 0; i < sizeof(U); ++i) {
    p[i] = static_cast<std::byte>((static_cast<std::uint64_t>(v) >> (8 * i)) & 0xFF);
  }
}

template <class U>
constexpr U get(const std::byte* p) noexcept {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < sizeof(U); ++i) v |= std::uint64_t(std::to_integer<unsigned>(p[i])) << (8 * i);
  return static_cast<U>(v);
}

}  // namespace detail::wire

/// Writes `h` as the 64 header bytes.
constexpr frame_bytes encode_frame(const frame_header& h) noexcept {
  using detail::wire::put;
  frame_bytes b{};
  put(&b[0], frame_header::magic);
  put(&b[4], frame_header::version);
  put(&b[6], static_cast<std::uint16_t>(h.kind));
  put(&b[8], h.tag);
  put(&b[16], h.seq);
  put(&b[24], h.length);
  put(&b[32], static_cast<std::uint8_t>(h.sig.op));
  put(&b[33], static_cast<std::uint8_t>(h.sig.algo));
  put(&b[34], static_cast<std::uint8_t>(h.sig.type));
  put(&b[35], static_cast<std::uint8_t>(h.sig.redop));
  put(&b[36], static_cast<std::uint32_t>(h.sig.root));
  put(&b[40], h.sig.count);
  put(&b[48], h.sig.seq);
  return b;
}

/// The result of decoding a header: the header, or why the bytes are not one.
struct frame_decode_result {
  bool ok = false;
  frame_header header{};
  std::string error;  ///< set when !ok: which field is wrong and what it held
};

/// Reads and validates 64 header bytes received on a connection.
/// @param expected_seq the sequence number the next frame on this connection must carry
/// @param max_length the largest payload this receiver accepts
/// Never reads past `bytes`, never allocates beyond the error text, never throws for bad input.
inline frame_decode_result decode_frame(std::span<const std::byte> bytes, std::uint64_t expected_seq,
                                        std::uint64_t max_length) {
  using detail::wire::get;
  frame_decode_result r;
  auto fail = [&r](std::string what) {
    r.error = std::move(what);
    return r;
  };
  if (bytes.size() != frame_header::size) {
    return fail("a frame header is " + std::to_string(frame_header::size) + " bytes, not " +
                std::to_string(bytes.size()));
  }
  const std::byte* p = bytes.data();
  if (auto m = get<std::uint32_t>(p); m != frame_header::magic) {
    return fail("bad magic 0x" + [m] {
      static constexpr char digits[] = "0123456789abcdef";
      std::string s(8, '0');
      for (int i = 0; i < 8; ++i) s[static_cast<std::size_t>(7 - i)] = digits[(m >> (4 * i)) & 0xF];
      return s;
    }() + " (not a dtrain peer, or the stream lost its place)");
  }
  if (auto v = get<std::uint16_t>(p + 4); v != frame_header::version) {
    return fail("wire version " + std::to_string(v) + " where " +
                std::to_string(frame_header::version) + " is spoken");
  }
  auto kind = get<std::uint16_t>(p + 6);
  if (kind > static_cast<std::uint16_t>(frame_kind::remote_done)) {
    return fail("unknown frame kind " + std::to_string(kind));
  }
  r.header.kind = static_cast<frame_kind>(kind);
  r.header.tag = get<std::uint64_t>(p + 8);
  r.header.seq = get<std::uint64_t>(p + 16);
  r.header.length = get<std::uint64_t>(p + 24);
  if (r.header.seq != expected_seq) {
    return fail("frame sequence number " + std::to_string(r.header.seq) + " where " +
                std::to_string(expected_seq) + " was next");
  }
  if (r.header.length > max_length) {
    return fail("frame of " + std::to_string(r.header.length) + " bytes exceeds the maximum of " +
                std::to_string(max_length));
  }
  auto op = get<std::uint8_t>(p + 32);
  auto algo = get<std::uint8_t>(p + 33);
  auto type = get<std::uint8_t>(p + 34);
  auto redop = get<std::uint8_t>(p + 35);
  if (op > static_cast<std::uint8_t>(last_coll_op) ||
      algo > static_cast<std::uint8_t>(last_algorithm) ||
      type > static_cast<std::uint8_t>(last_dtype) ||
      redop > static_cast<std::uint8_t>(last_reduce_op)) {
    return fail("signature holds out-of-range fields");
  }
  if (get<std::uint64_t>(p + 56) != 0) return fail("reserved header bytes are not zero");
  r.header.sig.op = static_cast<coll_op>(op);
  r.header.sig.algo = static_cast<algorithm>(algo);
  r.header.sig.type = static_cast<dtype>(type);
  r.header.sig.redop = static_cast<reduce_op>(redop);
  r.header.sig.root = static_cast<std::int32_t>(get<std::uint32_t>(p + 36));
  r.header.sig.count = get<std::uint64_t>(p + 40);
  r.header.sig.seq = get<std::uint64_t>(p + 48);
  r.ok = true;
  return r;
}

}  // namespace dtrain
