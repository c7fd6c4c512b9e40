#pragma once
// `detail::scratch_buffer<T>`: the growable buffer the collective algorithms receive into. A vector
// without `std::vector<bool>`'s packing, so every element type (bool included) has contiguous
// storage a span can view and a transport can write.

#include <algorithm>
#include <cstddef>
#include <memory>
#include <span>

namespace dtrain::detail {

template <class T>
class scratch_buffer {
 public:
  T* data() noexcept { return data_.get(); }
  const T* data() const noexcept { return data_.get(); }
  std::size_t size() const noexcept { return size_; }
  T* begin() noexcept { return data(); }
  T* end() noexcept { return data() + size_; }
  operator std::span<T>() noexcept { return {data(), size_}; }

  /// Makes room for `n` elements, keeping the first min(n, size()) and zeroing any new ones.
  /// Never shrinks the allocation, so a buffer reused across calls allocates once.
  void resize(std::size_t n) {
    if (n > capacity_) {
      auto grown = std::make_unique<T[]>(n);  // value-initialised
      std::copy(data(), data() + size_, grown.get());
      data_ = std::move(grown);
      capacity_ = n;
    } else if (n > size_) {
      std::fill(data() + size_, data() + n, T{});
    }
    size_ = n;
  }

  /// Replaces the contents with [first, last).
  template <class It>
  void assign(It first, It last) {
    size_ = 0;
    resize(static_cast<std::size_t>(std::distance(first, last)));
    std::copy(first, last, data());
  }

 private:
  std::unique_ptr<T[]> data_;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
};

}  // namespace dtrain::detail
