#pragma once
// Gathered and scattered messages (the transport concept, items 5 and 6) for the transports that
// move bytes themselves: a fixed array of ranges an operation keeps, where a receive puts a
// message of a given size, and the copy between the two forms.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

#include "dtrain/concepts/transport.hpp"
#include "dtrain/core/error.hpp"

namespace dtrain::detail {

// Up to max_message_parts ranges, copied out of the caller's list (which may be a temporary).
template <class Byte>
class part_array {
 public:
  part_array() = default;
  explicit part_array(std::span<const std::span<Byte>> list) {
    DTRAIN_ASSERT(list.size() <= max_message_parts, "a message of more than max_message_parts ranges");
    for (auto p : list) {
      if (!p.empty()) push(p);  // empty ranges carry nothing; dropping them keeps cursors simple
    }
  }
  explicit part_array(std::span<Byte> one) {
    if (!one.empty()) push(one);
  }

  std::span<const std::span<Byte>> view() const noexcept { return {parts_.data(), count_}; }
  std::size_t count() const noexcept { return count_; }
  std::size_t bytes() const noexcept { return bytes_; }
  std::span<Byte> operator[](std::size_t i) const noexcept { return parts_[i]; }

 private:
  void push(std::span<Byte> p) noexcept {
    parts_[count_++] = p;
    bytes_ += p.size();
  }

  std::array<std::span<Byte>, max_message_parts> parts_{};
  std::size_t count_ = 0;
  std::size_t bytes_ = 0;
};

using send_parts = part_array<const std::byte>;
using receive_parts = part_array<std::byte>;

// Where a receive of `parts` with `overflow` puts a message of `n` bytes: in the parts when it
// fits them (clearing the overflow vector), else whole in the overflow vector, else nowhere
// (`truncated`: the message is consumed and the receive fails).
struct landing {
  receive_parts parts;
  bool truncated = false;
};

inline landing land(const receive_parts& parts, std::vector<std::byte>* overflow, std::size_t n) {
  if (n <= parts.bytes()) {
    if (overflow != nullptr) overflow->clear();
    return {parts, false};
  }
  if (overflow == nullptr) return {{}, true};
  overflow->resize(n);
  return {receive_parts(std::span<std::byte>(overflow->data(), n)), false};
}

// Copies the gathered `from` into the scattered `to`, which holds at least as many bytes.
inline void scatter_copy(const send_parts& from, const receive_parts& to) noexcept {
  std::size_t part = 0, offset = 0;
  for (auto src : from.view()) {
    while (!src.empty()) {
      const auto dst = to[part].subspan(offset);
      const std::size_t n = std::min(src.size(), dst.size());
      std::memcpy(dst.data(), src.data(), n);
      src = src.subspan(n);
      offset += n;
      if (offset == to[part].size()) {
        ++part;
        offset = 0;
      }
    }
  }
}

// Copies a whole message, gathered in `from`, into a receive of `parts` with `overflow` (where
// `land` says). @returns false if it fits neither: the receive is then truncated.
inline bool copy_message(const send_parts& from, const receive_parts& parts, std::vector<std::byte>* overflow) {
  const landing into = land(parts, overflow, from.bytes());
  if (!into.truncated) scatter_copy(from, into.parts);
  return !into.truncated;
}

}  // namespace dtrain::detail
