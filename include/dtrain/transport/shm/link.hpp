#pragma once
// One rank's state for one peer of the shared-memory engine, both directions, and the copies
// between a ring and an operation's gathered or scattered bytes.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>
#include <array>

#include "dtrain/core/frame.hpp"
#include "dtrain/detail/message_parts.hpp"
#include "dtrain/transport/byte_operation.hpp"
#include "dtrain/transport/shm/options.hpp"
#include "dtrain/transport/shm/ring.hpp"
#include "dtrain/transport/shm/segment.hpp"

namespace dtrain::detail::shm {

struct settings {
  shm_options options;                 // as given, with the ring size the group agreed on
  std::vector<std::string> fallbacks;  // peers this rank may not read though single copy is on, and why
};

// Bytes copied between publishing a ring's counter: the other side starts on them meanwhile.
inline constexpr std::size_t chunk_bytes = std::size_t{64} << 10;
// How often the peers' processes are checked.
inline constexpr std::chrono::milliseconds watch_period{2};

// One peer, both directions.
struct link {
  segment inbox;                  // the peer's inbox (mapped; its owner unlinked the name)
  inbox_header* peer = nullptr;   // its header: bell, sleepers, closed
  ring_writer out;                // this rank's ring in it
  std::deque<byte_op_ptr> sendq;  // sends to the peer, in order; the front one may be half written
  std::uint64_t tx_seq = 0;
  bool single_copy = false;                    // the peer can read this rank's memory
  std::map<std::uint64_t, byte_op_ptr> awaiting;  // remote sends by frame, until the peer has read them

  ring_reader in;  // the peer's ring in this rank's inbox
  std::uint64_t rx_seq = 0;
  bool rx_active = false;  // a frame's header is read, its payload is not done
  frame_header rx_frame{};
  std::size_t rx_got = 0;
  receive_parts rx_parts;  // where the payload goes (a posted receive's parts or an early message)
  bool rx_truncated = false;
  byte_op_ptr rx_recv;
  early_message_ptr rx_early;

  process_watch watch;
  bool departed = false;  // its goodbye was read
  bool lost = false;      // it died without one
};

// What a pass does with a message no receive is posted for: takes it into a buffer of its own
// (the last frames of a peer that died) or leaves it in the ring while nothing waits behind it.
enum class unexpected { take, leave };

// A remote frame's header is followed by the ranges of its payload: a count, then (address,
// bytes) pairs, always max_message_parts of them.
inline constexpr std::size_t remote_descriptor_bytes = 8 + 16 * max_message_parts;
using remote_descriptor = std::array<std::byte, remote_descriptor_bytes>;

inline remote_descriptor encode_remote(const send_parts& parts) noexcept {
  remote_descriptor d{};
  wire::put(&d[0], static_cast<std::uint64_t>(parts.count()));
  for (std::size_t i = 0; i < parts.count(); ++i) {
    wire::put(&d[8 + 16 * i], reinterpret_cast<std::uint64_t>(parts[i].data()));
    wire::put(&d[16 + 16 * i], static_cast<std::uint64_t>(parts[i].size()));
  }
  return d;
}

// The ranges, if they are well formed and add up to the frame's `length`.
inline std::optional<remote_ranges> decode_remote(const remote_descriptor& d, std::uint64_t length) noexcept {
  remote_ranges r;
  r.count = wire::get<std::uint64_t>(&d[0]);
  if (r.count > max_message_parts) return std::nullopt;
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < r.count; ++i) {
    r.address[i] = wire::get<std::uint64_t>(&d[8 + 16 * i]);
    r.bytes[i] = wire::get<std::uint64_t>(&d[16 + 16 * i]);
    if (r.bytes[i] > length) return std::nullopt;  // so the sum cannot wrap
    total += r.bytes[i];
  }
  if (total != length) return std::nullopt;
  return r;
}

// Copies the next `n` bytes of `op` (header, then its gathered parts) into the ring.
inline void write_out(ring_writer& out, byte_operation& op, std::size_t n) {
  std::size_t at = op.written;
  op.written += n;
  if (at < frame_header::size) {
    const std::size_t h = std::min(n, frame_header::size - at);
    out.put(op.header.data() + at, h);
    at += h;
    n -= h;
  }
  std::size_t skip = at - frame_header::size;
  for (auto part : op.data.view()) {
    if (n == 0) break;
    if (skip >= part.size()) {
      skip -= part.size();
      continue;
    }
    const std::size_t m = std::min(n, part.size() - skip);
    out.put(part.data() + skip, m);
    n -= m;
    skip = 0;
  }
}

// Copies the next `n` payload bytes out of the ring into the frame's parts.
inline void read_in(link& l, std::size_t n) {
  std::size_t skip = l.rx_got;
  for (std::size_t i = 0; i < l.rx_parts.count() && n > 0; ++i) {
    const auto part = l.rx_parts[i];
    if (skip >= part.size()) {
      skip -= part.size();
      continue;
    }
    const std::size_t m = std::min(n, part.size() - skip);
    l.in.take(part.data() + skip, m);
    n -= m;
    skip = 0;
  }
}

}  // namespace dtrain::detail::shm
