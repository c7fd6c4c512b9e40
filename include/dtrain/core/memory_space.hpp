#pragma once
/// @file
/// Memory spaces as types, so that a buffer's location is known at compile time.
///
/// Host buffers are `std::span<T>`; device buffers are `device_span<T>`, a distinct type with no
/// conversion to or from `std::span` and no element access on the host. A collective or
/// reduction names the space it works in (`memory_space`), and its operations take
/// `span_in<memory_space, T>`: handing device memory to a host collective (or host memory to
/// NCCL) does not compile.
///
/// <!-- frame: header_nccl_comm -->
/// @code
/// dtrain::device_span<float> grads(device_ptr, n);   // the caller vouches: device memory
/// nccl.allreduce(grads, dtrain::reduce_op::sum);      // fine
/// // host_comm.allreduce(grads, dtrain::reduce_op::sum);  // does not compile: not a std::span
/// @endcode

#include <cstddef>
#include <span>
#include <type_traits>

#include "dtrain/core/config.hpp"

namespace dtrain {

/// Ordinary host memory: every transport and the host reductions can read it.
struct host_memory {};

/// GPU device memory: only device-aware models (NCCL, Thrust on CUDA, staged TCP) accept it.
struct device_memory {};

/// `n` elements of device memory at `data`: a pointer and a length that the host may pass on
/// but not dereference. Converts to `device_span<const T>`, never to a host span.
template <class T>
class device_span {
 public:
  using element_type = T;
  using value_type = std::remove_cv_t<T>;
  using memory_space = device_memory;

  constexpr device_span() noexcept = default;
  /// The caller vouches that `[data, data + n)` is device memory.
  DTRAIN_HOST_DEVICE constexpr device_span(T* data, std::size_t n) noexcept : data_(data), size_(n) {}
  /// `device_span<T>` to `device_span<const T>`.
  template <class U>
    requires(std::is_same_v<std::remove_const_t<T>, U> && std::is_const_v<T>)
  DTRAIN_HOST_DEVICE constexpr device_span(device_span<U> other) noexcept : data_(other.data()), size_(other.size()) {}

  DTRAIN_HOST_DEVICE constexpr T* data() const noexcept { return data_; }
  DTRAIN_HOST_DEVICE constexpr std::size_t size() const noexcept { return size_; }
  DTRAIN_HOST_DEVICE constexpr std::size_t size_bytes() const noexcept { return size_ * sizeof(T); }
  DTRAIN_HOST_DEVICE constexpr bool empty() const noexcept { return size_ == 0; }
  DTRAIN_HOST_DEVICE constexpr device_span subspan(std::size_t offset, std::size_t count) const noexcept {
    return {data_ + offset, count};
  }
  DTRAIN_HOST_DEVICE constexpr device_span subspan(std::size_t offset) const noexcept {
    return {data_ + offset, size_ - offset};
  }
  DTRAIN_HOST_DEVICE constexpr device_span first(std::size_t count) const noexcept { return {data_, count}; }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

namespace detail {
template <class Space, class T>
struct span_in_space;
template <class T>
struct span_in_space<host_memory, T> {
  using type = std::span<T>;
};
template <class T>
struct span_in_space<device_memory, T> {
  using type = device_span<T>;
};
}  // namespace detail

/// The buffer type of memory space `Space`: `std::span<T>` on the host, `device_span<T>` on
/// the device.
template <class Space, class T>
using span_in = typename detail::span_in_space<Space, T>::type;

/// The memory space of a span type.
template <class Span>
struct memory_space_of {
  using type = host_memory;
};
template <class T>
struct memory_space_of<device_span<T>> {
  using type = device_memory;
};

}  // namespace dtrain
