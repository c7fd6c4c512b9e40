#pragma once
// `detail::buffer_pool`: byte buffers kept for reuse, for the messages a transport must hold
// because they came before their receive. glibc serves an allocation of 128 KiB or more with a
// fresh mapping (its mmap threshold), so each such message paid a page fault per 4 KiB written
// and an munmap after its copy; a collective's early messages come in the same few sizes call
// after call, so a handful of kept buffers serves them all. Smaller ones come from glibc's heap,
// where they are cheap. Bounded: a few buffers, none huge.

#include <algorithm>
#include <cstddef>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace dtrain::detail {

class buffer_pool {
 public:
  /// A buffer and its size; `data` holds at least the bytes asked for.
  struct buffer {
    std::unique_ptr<std::byte[]> data;
    std::size_t capacity = 0;
  };

  /// Below `min_bytes` a buffer comes from the heap (cheap there) and goes back to it; at most
  /// `max_kept` buffers of at most `max_bytes` each are kept.
  static constexpr std::size_t min_bytes = std::size_t{128} << 10;
  static constexpr std::size_t max_bytes = std::size_t{4} << 20;
  static constexpr std::size_t max_kept = 4;

  /// A buffer of at least `bytes`: the smallest kept one that fits, else a new one (uninitialised).
  buffer take(std::size_t bytes) {
    if (bytes >= min_bytes) {
      std::lock_guard lock(m_);
      auto best = kept_.end();
      for (auto it = kept_.begin(); it != kept_.end(); ++it) {
        if (it->capacity >= bytes && (best == kept_.end() || it->capacity < best->capacity)) best = it;
      }
      if (best != kept_.end()) {
        buffer b = std::move(*best);
        kept_.erase(best);
        return b;
      }
    }
    const std::size_t n = std::max<std::size_t>(bytes, 1);
    return {std::make_unique_for_overwrite<std::byte[]>(n), n};
  }

  /// Takes `b` back: kept if it is pool-sized and there is room (else the smallest kept one makes
  /// way for a larger `b`), freed otherwise.
  void give(buffer b) noexcept {
    if (b.data == nullptr || b.capacity < min_bytes || b.capacity > max_bytes) return;
    std::lock_guard lock(m_);
    if (kept_.size() < max_kept) {
      kept_.push_back(std::move(b));  // reserved: never allocates
      return;
    }
    auto smallest = std::min_element(kept_.begin(), kept_.end(),
                                     [](const buffer& x, const buffer& y) { return x.capacity < y.capacity; });
    if (smallest->capacity < b.capacity) std::swap(*smallest, b);
  }  // `b`, the one not kept, is freed here, after the lock: an munmap under it would stall takers

  /// How many buffers are kept (for tests).
  std::size_t kept() const {
    std::lock_guard lock(m_);
    return kept_.size();
  }

  buffer_pool() { kept_.reserve(max_kept); }
  buffer_pool(const buffer_pool&) = delete;
  buffer_pool& operator=(const buffer_pool&) = delete;

 private:
  mutable std::mutex m_;
  std::vector<buffer> kept_;
};

}  // namespace dtrain::detail
