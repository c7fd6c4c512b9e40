#pragma once
/// @file
/// The memory, streams and events of Thrust's device system in this build, under one set of
/// names, so that GPU code paths (the device updater, the device trainer) are also the code that
/// runs, and is tested, on the CPU:
///  - THRUST_DEVICE_SYSTEM CUDA: device buffers, CUDA streams and events, work enqueued with
///    `thrust::cuda::par_nosync.on(stream)`.
///  - CPP / OMP / TBB: host vectors; a "stream" is the calling thread (work runs at once), and
///    events are already complete.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

#include <thrust/execution_policy.h>

#include "dtrain/core/memory_space.hpp"

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
#include "dtrain/cuda/runtime.hpp"
#endif

namespace dtrain {

/// The memory `thrust::device` works on in this build: device memory under CUDA, host memory
/// under the CPP, OMP and TBB systems.
/// `thrust_buffer<T>` is the span type of that memory (`device_span`, or `std::span`).
#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
using thrust_device_memory = device_memory;
template <class T>
using thrust_buffer = device_span<T>;
#else
using thrust_device_memory = host_memory;
template <class T>
using thrust_buffer = std::span<T>;
#endif

}  // namespace dtrain

namespace dtrain::detail::thrust_space {

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA

using stream_handle = cudaStream_t;
using owned_stream = cuda::stream;
using event = cuda::event;
template <class T>
using buffer = cuda::device_buffer<T>;
/// Host memory the device copies to and from at full speed (page-locked).
template <class T>
using pinned = cuda::pinned_buffer<T>;

/// A stream ordered after the legacy default stream's earlier work (`cuda::stream`).
inline owned_stream ordered_with_default() { return owned_stream::ordered_with_default(); }
/// The execution policy that enqueues on `s` without synchronising.
inline auto on(stream_handle s) { return thrust::cuda::par_nosync.on(s); }

template <class T>
void copy(thrust_buffer<T> dst, thrust_buffer<const T> src, stream_handle s) {
  cuda::copy_async<T>(dst, src, s);
}
template <class T>
void zero(thrust_buffer<T> dst, stream_handle s) {
  cuda::check(cudaMemsetAsync(dst.data(), 0, dst.size_bytes(), s), "cudaMemsetAsync");
}
inline void synchronize(stream_handle s) { cuda::check(cudaStreamSynchronize(s), "cudaStreamSynchronize"); }
/// The calling thread's device, and making it another thread's (CUDA's is per thread).
inline int current_device() {
  int device = 0;
  cuda::check(cudaGetDevice(&device), "cudaGetDevice");
  return device;
}
inline void use_device(int device) { cuda::check(cudaSetDevice(device), "cudaSetDevice"); }
/// Copies host values into device memory and waits.
template <class T>
void upload(thrust_buffer<T> dst, std::span<const T> src, stream_handle s) {
  cuda::copy_async<T>(dst, src, s);
  synchronize(s);
}
/// Copies device values into host memory and waits.
template <class T>
void download(std::span<T> dst, thrust_buffer<const T> src, stream_handle s) {
  cuda::copy_async<const T>(dst, src, s);
  synchronize(s);
}

#else

/// The calling thread: work "enqueued" on it has run when the call returns.
struct stream_handle {};
struct owned_stream {
  stream_handle get() const noexcept { return {}; }
  void synchronize() const noexcept {}
};
inline owned_stream ordered_with_default() noexcept { return {}; }
struct event {
  void record(stream_handle) noexcept {}
  void make_wait(stream_handle) const noexcept {}
  bool ready() const noexcept { return true; }
};
template <class T>
class buffer {
 public:
  buffer() = default;
  explicit buffer(std::size_t n) : v_(n) {}
  T* data() noexcept { return v_.data(); }
  std::size_t size() const noexcept { return v_.size(); }
  std::span<T> span() noexcept { return v_; }
  std::span<const T> span() const noexcept { return v_; }

 private:
  std::vector<T> v_;
};

template <class T>
using pinned = buffer<T>;

inline auto on(stream_handle) { return thrust::device; }
template <class T>
void copy(thrust_buffer<T> dst, thrust_buffer<const T> src, stream_handle) {
  if (!src.empty()) std::memmove(dst.data(), src.data(), src.size_bytes());
}
template <class T>
void zero(thrust_buffer<T> dst, stream_handle) {
  if (!dst.empty()) std::memset(static_cast<void*>(dst.data()), 0, dst.size_bytes());  // 16-bit types too
}
inline void synchronize(stream_handle) noexcept {}
inline int current_device() noexcept { return 0; }
inline void use_device(int) noexcept {}
template <class T>
void upload(thrust_buffer<T> dst, std::span<const T> src, stream_handle s) {
  copy<T>(dst, src, s);
}
template <class T>
void download(std::span<T> dst, thrust_buffer<const T> src, stream_handle s) {
  copy<T>(dst, src, s);
}

#endif

/// Every rank's `mine`, in rank order, gathered through device memory (NCCL takes no other),
/// the copies on `stream`. Collective over `comm`, a collective of this build's device memory.
template <class Collective>
std::vector<std::int64_t> allgather_through_device(Collective& comm, std::span<const std::int64_t> mine,
                                                   stream_handle stream) {
  const auto n = static_cast<std::size_t>(comm.size());
  buffer<std::int64_t> in(mine.size()), out(mine.size() * n);
  upload<std::int64_t>(in.span(), mine, stream);
  comm.allgather(thrust_buffer<const std::int64_t>(in.span()), out.span());
  std::vector<std::int64_t> all(mine.size() * n);
  download<std::int64_t>(all, out.span(), stream);
  return all;
}

/// `src` copied into a new host vector (waits for `s`'s work before it, and the copy).
template <class T>
std::vector<T> to_host(thrust_buffer<const T> src, stream_handle s) {
  std::vector<T> host(src.size());
  download<T>(std::span<T>(host), src, s);
  return host;
}

}  // namespace dtrain::detail::thrust_space
