#pragma once
// The layout of a rank's inbox segment and the single-producer, single-consumer byte rings in it.
//
//   inbox_header (256 bytes: identity, token proof, bell)
//   ring from rank 0: ring_control (128 bytes: head and tail on cache lines of their own), data
//   ring from rank 1: ...
//
// A ring is a byte stream, like a TCP connection: the sender writes 64-byte frame headers
// (core/frame.hpp) and payloads into it, the receiver reads them out. `head` counts bytes
// written, `tail` bytes consumed; each is written by one side only (release) and read by the
// other (acquire), so no lock is shared between processes. Each side keeps its own copy of its
// counter and checks the other's on every read, so a corrupt counter is an error, not a hang.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "dtrain/core/error.hpp"

namespace dtrain::detail::shm {

inline constexpr std::size_t cache_line = 64;

struct inbox_header {
  static constexpr std::uint64_t magic_value = 0x31304d4853525444;  // "DTRSHM01"
  std::uint64_t magic = 0;
  std::uint32_t size = 0;  // ranks in the group (rings in the segment)
  std::int32_t rank = 0;   // the owner, who receives through every ring here
  std::int32_t pid = 0;
  std::uint32_t reserved = 0;
  std::uint64_t ring_bytes = 0;
  std::uint64_t epoch = 0;
  unsigned char proof[32] = {};  // HMAC(token, name | rank | pid | epoch): the creator holds the token
  std::uint64_t probe_address = 0;  // where this header lies in its owner: peers test reading it
  alignas(cache_line) std::atomic<std::uint32_t> bell{0};  // bumped when data or room appears for the owner
  std::atomic<std::uint32_t> sleepers{0};                   // owner threads asleep on the bell
  std::atomic<std::uint32_t> closed{0};                     // the owner left: writing here is pointless
};
inline constexpr std::size_t header_bytes = 256;
static_assert(sizeof(inbox_header) <= header_bytes);

struct ring_control {
  alignas(cache_line) std::atomic<std::uint64_t> head{0};
  alignas(cache_line) std::atomic<std::uint64_t> tail{0};
  std::atomic<std::uint32_t> single_copy{0};  // set by the reader at formation: it can read the writer's memory
};
static_assert(sizeof(ring_control) == 2 * cache_line);

/// Bytes of an inbox for `size` rings of `ring_bytes` each.
constexpr std::size_t inbox_bytes(int size, std::size_t ring_bytes) noexcept {
  return header_bytes + static_cast<std::size_t>(size) * (sizeof(ring_control) + ring_bytes);
}
inline ring_control* ring_at(std::byte* inbox, int sender, std::size_t ring_bytes) noexcept {
  return reinterpret_cast<ring_control*>(inbox + header_bytes +
                                         static_cast<std::size_t>(sender) * (sizeof(ring_control) + ring_bytes));
}

inline void corrupt_ring(const std::string& which, std::uint64_t head, std::uint64_t tail) {
  throw error(errc::protocol_error, "dtrain: the shared-memory ring " + which + " is corrupt (head " +
                                        std::to_string(head) + ", tail " + std::to_string(tail) + ")");
}

/// The sending side of one ring.
class ring_writer {
 public:
  ring_writer() = default;
  ring_writer(ring_control* ctl, std::size_t capacity, std::string name)
      : ctl_(ctl), data_(reinterpret_cast<std::byte*>(ctl + 1)), cap_(capacity), name_(std::move(name)) {}

  /// Bytes that can be written now. @throws dtrain::error if the reader's counter is corrupt
  std::size_t room() {
    if (cap_ - (head_ - tail_) == 0 || head_ - tail_ > cap_ / 2) {
      tail_ = ctl_->tail.load(std::memory_order_acquire);
      if (tail_ > head_ || head_ - tail_ > cap_) corrupt_ring(name_, head_, tail_);
    }
    return cap_ - (head_ - tail_);
  }
  /// Appends `n` <= room() bytes; the reader sees them after `publish`.
  void put(const std::byte* src, std::size_t n) noexcept {
    const std::size_t at = head_ & (cap_ - 1), first = std::min(n, cap_ - at);
    std::memcpy(data_ + at, src, first);
    std::memcpy(data_, src + first, n - first);
    head_ += n;
  }
  void publish() noexcept { ctl_->head.store(head_, std::memory_order_release); }

 private:
  ring_control* ctl_ = nullptr;
  std::byte* data_ = nullptr;
  std::size_t cap_ = 0;  // a power of two
  std::uint64_t head_ = 0, tail_ = 0;
  std::string name_;
};

/// The receiving side of one ring.
class ring_reader {
 public:
  ring_reader() = default;
  ring_reader(ring_control* ctl, std::size_t capacity, std::string name)
      : ctl_(ctl), data_(reinterpret_cast<std::byte*>(ctl + 1)), cap_(capacity), name_(std::move(name)) {}

  /// Bytes that can be read now. @throws dtrain::error if the writer's counter is corrupt
  std::size_t ready() {
    if (head_ == tail_) {
      head_ = ctl_->head.load(std::memory_order_acquire);
      if (head_ < tail_ || head_ - tail_ > cap_) corrupt_ring(name_, head_, tail_);
    }
    return head_ - tail_;
  }
  /// Copies out and consumes `n` <= ready() bytes; the writer reuses them after `publish`.
  void take(std::byte* dst, std::size_t n) noexcept {
    peek(dst, n);
    tail_ += n;
  }
  /// Copies out `n` <= ready() bytes and leaves them in the ring.
  void peek(std::byte* dst, std::size_t n) const noexcept {
    const std::size_t at = tail_ & (cap_ - 1), first = std::min(n, cap_ - at);
    std::memcpy(dst, data_ + at, first);
    std::memcpy(dst + first, data_, n - first);
  }
  /// Consumes `n` <= ready() bytes unread (a truncated message's payload).
  void skip(std::size_t n) noexcept { tail_ += n; }
  void publish() noexcept { ctl_->tail.store(tail_, std::memory_order_release); }
  const std::string& name() const noexcept { return name_; }

 private:
  ring_control* ctl_ = nullptr;
  std::byte* data_ = nullptr;
  std::size_t cap_ = 0;
  std::uint64_t head_ = 0, tail_ = 0;
  std::string name_;
};

}  // namespace dtrain::detail::shm
