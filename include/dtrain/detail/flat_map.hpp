#pragma once
// An open-addressing hash map from 64-bit keys to 32-bit slots, for the parameter server's key
// lookups: one array probe in the common case, no allocation per key (std::unordered_map costs
// a node per key and a pointer chase per lookup, which a sparse push of 100k keys feels).

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace dtrain::detail {

class flat_key_map {
 public:
  static constexpr std::uint32_t none = std::numeric_limits<std::uint32_t>::max();

  /// The slot stored for `key`, or `none`.
  std::uint32_t find(std::uint64_t key) const noexcept {
    if (slots_.empty()) return none;
    for (std::size_t i = home(key);; i = (i + 1) & mask_) {
      if (slots_[i] == none) return none;
      if (keys_[i] == key) return slots_[i];
    }
  }

  /// Starts loading `key`'s home slot into the cache: a batch of lookups issued a few keys ahead
  /// overlaps their cache misses instead of paying them one after another.
  void prefetch(std::uint64_t key) const noexcept {
    if (slots_.empty()) return;
    const std::size_t i = home(key);
    __builtin_prefetch(&keys_[i]);
    __builtin_prefetch(&slots_[i]);
  }

  /// Stores `slot` for `key` (not present yet).
  void insert(std::uint64_t key, std::uint32_t slot) {
    if (2 * (size_ + 1) > slots_.size()) grow();  // load factor at most 1/2: short probe runs
    place(key, slot);
    ++size_;
  }

  std::size_t size() const noexcept { return size_; }

 private:
  std::size_t home(std::uint64_t key) const noexcept {
    // Fibonacci hashing: keys that differ in low bits spread over the whole table.
    return static_cast<std::size_t>((key * 0x9e3779b97f4a7c15ull) >> shift_) & mask_;
  }

  void place(std::uint64_t key, std::uint32_t slot) noexcept {
    std::size_t i = home(key);
    while (slots_[i] != none) i = (i + 1) & mask_;
    keys_[i] = key;
    slots_[i] = slot;
  }

  void grow() {
    const std::size_t capacity = slots_.empty() ? 64 : 2 * slots_.size();
    std::vector<std::uint64_t> old_keys(capacity, 0);
    std::vector<std::uint32_t> old_slots(capacity, none);
    old_keys.swap(keys_);
    old_slots.swap(slots_);
    mask_ = capacity - 1;
    shift_ = 64;
    for (std::size_t c = capacity; c > 1; c >>= 1) --shift_;
    for (std::size_t i = 0; i < old_slots.size(); ++i) {
      if (old_slots[i] != none) place(old_keys[i], old_slots[i]);
    }
  }

  std::vector<std::uint64_t> keys_;
  std::vector<std::uint32_t> slots_;
  std::size_t size_ = 0, mask_ = 0;
  int shift_ = 64;
};

}  // namespace dtrain::detail
