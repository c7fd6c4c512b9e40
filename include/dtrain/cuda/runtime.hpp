#pragma once
/// @file
/// The CUDA runtime pieces dtrain's GPU layer shares: errors as `dtrain::error`, owning
/// streams, events, device and pinned host buffers, the device count and a rank's device. Host code only: it
/// compiles with any C++20 compiler against the CUDA runtime (link `dtrain::cuda`).

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdlib>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "dtrain/core/error.hpp"
#include "dtrain/core/memory_space.hpp"

namespace dtrain::cuda {

/// @throws dtrain::error `device_error` naming `what` and CUDA's explanation
inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw error(errc::device_error,
                std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
  }
}

/// Visible devices; 0 when there is no driver or no GPU (never throws).
inline int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

/// Makes `device` current for a scope (and the previous one again after it): streams and events
/// belong to the device they were made on, whichever thread uses them.
class on_device {
 public:
  explicit on_device(int device) {
    cuda::check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) cuda::check(cudaSetDevice(device), "cudaSetDevice");
    changed_ = previous_ != device;
  }
  on_device(const on_device&) = delete;
  on_device& operator=(const on_device&) = delete;
  ~on_device() {
    if (changed_) cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
  bool changed_ = false;
};

/// The GPU a rank of this host takes: its local rank (DTRAIN_LOCAL_RANK, which dtrain-run sets,
/// else `fallback`) modulo the visible devices, so that a host's ranks take its GPUs in turn.
/// @throws dtrain::error `device_error` when no device is visible
inline int local_device(int fallback = 0) {
  const int n = device_count();
  if (n == 0) throw error(errc::device_error, "no CUDA device is visible on this host");
  const char* local = std::getenv("DTRAIN_LOCAL_RANK");
  return (local != nullptr ? std::atoi(local) : fallback) % n;
}

/// An owned CUDA stream on the current device: non-blocking (unordered with the legacy default
/// stream) unless made by `ordered_with_default`.
class stream {
 public:
  stream() : stream(cudaStreamNonBlocking) {}
  /// A stream whose work waits for what the legacy default stream had enqueued before it (and
  /// the other way round), as `cudaStreamCreate` makes. A communicator that reads a caller's
  /// buffer uses one: a pageable `cudaMemcpy` into that buffer, or a kernel on stream 0, may
  /// still be in flight when the host call returns.
  static stream ordered_with_default() { return stream(cudaStreamDefault); }
  stream(stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  stream& operator=(stream&& o) noexcept {
    std::swap(s_, o.s_);
    return *this;
  }
  ~stream() {
    if (s_ != nullptr) cudaStreamDestroy(s_);
  }
  cudaStream_t get() const noexcept { return s_; }
  void synchronize() const { check(cudaStreamSynchronize(s_), "cudaStreamSynchronize"); }

 private:
  explicit stream(unsigned flags) { check(cudaStreamCreateWithFlags(&s_, flags), "cudaStreamCreate"); }
  cudaStream_t s_ = nullptr;
};

/// An owned CUDA event without timing (cheapest to record and query).
class event {
 public:
  event() { check(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming), "cudaEventCreate"); }
  event(event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  event& operator=(event&& o) noexcept {
    std::swap(e_, o.e_);
    return *this;
  }
  ~event() {
    if (e_ != nullptr) cudaEventDestroy(e_);
  }
  cudaEvent_t get() const noexcept { return e_; }
  void record(cudaStream_t s) { check(cudaEventRecord(e_, s), "cudaEventRecord"); }
  /// Work enqueued on `s` after this call waits for the work recorded before.
  void make_wait(cudaStream_t s) const { check(cudaStreamWaitEvent(s, e_, 0), "cudaStreamWaitEvent"); }
  /// @returns true once the recorded work has finished. @throws on a device error
  bool ready() const {
    const cudaError_t e = cudaEventQuery(e_);
    if (e == cudaErrorNotReady) return false;
    check(e, "cudaEventQuery");
    return true;
  }

 private:
  cudaEvent_t e_ = nullptr;
};

namespace detail {

struct device_allocation {
  static void* allocate(std::size_t bytes) {
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), "cudaMalloc");
    return p;
  }
  static void release(void* p) noexcept { cudaFree(p); }
};

struct pinned_allocation {
  static void* allocate(std::size_t bytes) {
    void* p = nullptr;
    check(cudaMallocHost(&p, bytes), "cudaMallocHost");
    return p;
  }
  static void release(void* p) noexcept { cudaFreeHost(p); }
};

// `n` elements of memory from `Allocation`, owned (move-only).
template <class T, class Allocation>
class owned_memory {
 public:
  owned_memory() = default;
  explicit owned_memory(std::size_t n)
      : p_(n > 0 ? static_cast<T*>(Allocation::allocate(n * sizeof(T))) : nullptr), n_(n) {}
  owned_memory(owned_memory&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  owned_memory& operator=(owned_memory&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~owned_memory() {
    if (p_ != nullptr) Allocation::release(p_);
  }
  T* data() noexcept { return p_; }
  const T* data() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace detail

/// `n` elements of device memory on the current device.
template <class T>
class device_buffer : public detail::owned_memory<T, detail::device_allocation> {
 public:
  using detail::owned_memory<T, detail::device_allocation>::owned_memory;
  device_span<T> span() noexcept { return {this->data(), this->size()}; }
  device_span<const T> span() const noexcept { return {this->data(), this->size()}; }
};

/// `n` elements of page-locked host memory: copies to and from the device run at full speed
/// and asynchronously.
template <class T>
class pinned_buffer : public detail::owned_memory<T, detail::pinned_allocation> {
 public:
  using detail::owned_memory<T, detail::pinned_allocation>::owned_memory;
  std::span<T> span() noexcept { return {this->data(), this->size()}; }
};

/// Enqueues a copy of `src` (device) into `dst` (host) on `s`.
template <class T>
void copy_async(std::span<std::remove_const_t<T>> dst, device_span<T> src, cudaStream_t s) {
  check(cudaMemcpyAsync(dst.data(), src.data(), src.size_bytes(), cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync D2H");
}
/// Enqueues a copy of `src` (host) into `dst` (device) on `s`.
template <class T>
void copy_async(device_span<T> dst, std::span<const T> src, cudaStream_t s) {
  check(cudaMemcpyAsync(dst.data(), src.data(), src.size_bytes(), cudaMemcpyHostToDevice, s), "cudaMemcpyAsync H2D");
}
/// Enqueues a device-to-device copy on `s`.
template <class T>
void copy_async(device_span<T> dst, device_span<const T> src, cudaStream_t s) {
  check(cudaMemcpyAsync(dst.data(), src.data(), src.size_bytes(), cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync D2D");
}

}  // namespace dtrain::cuda
