#pragma once
/// @file
/// The pipeline on device memory: `pipeline::link` for a point-to-point communicator of
/// Thrust's device memory (`staged_communicator<tcp_transport>`: ranks that share a GPU, or hosts
/// without NCCL), so that `executor<Comm, Stage>` runs stages whose parameters, gradients and
/// activations are device buffers. Link `dtrain::thrust` (and `dtrain::cuda` in a CUDA build).
///
/// Activations live in device buffers the executor keeps across steps; messages are the
/// communicator's `isend`/`irecv`, carrying the executor's signature (micro-batch and stage,
/// checked as on the host). Copies for weight stashing and the handshake run on the legacy
/// default stream, which the staged communicator's copies are ordered after: a stage whose
/// kernels run there, or have finished when `forward` and `backward` return, needs no more.
/// `pipeline::trainer` runs over the same link, with a `device_updater` and `Replicas` of that
/// memory (docs/model_parallel.md, "On device memory").
///
/// <!-- frame: header_device_pipeline -->
/// @code
/// using comm = dtrain::staged_communicator<dtrain::tcp_transport>;
/// comm pipeline(dtrain::tcp_transport::from_environment());
/// // my_device_stage: a dtrain::stage<S, dtrain::thrust_device_memory> (device_span tensors under CUDA)
/// std::vector<my_device_stage> chunks{my_device_stage(pipeline.rank())};
/// dtrain::pipeline::executor<comm, my_device_stage> run(pipeline, std::span(chunks));
/// @endcode

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include <thrust/transform.h>

#include "dtrain/concepts/point_to_point.hpp"
#include "dtrain/concepts/transport.hpp"
#include "dtrain/core/signature.hpp"
#include "dtrain/cuda/thrust_space.hpp"
#include "dtrain/pipeline/executor.hpp"
#include "dtrain/reduce/thrust.hpp"

namespace dtrain::pipeline {

/// A point-to-point communicator of Thrust's device memory.
template <class Comm, class T>
  requires(!transport<Comm> && point_to_point<Comm, T> &&
           std::is_same_v<typename Comm::memory_space, thrust_device_memory>)
struct link<Comm, T> {
  // Device memory that grows to the largest size asked of it; `view` is the size last asked.
  struct buffer {
    dtrain::detail::thrust_space::buffer<T> memory;
    std::size_t size = 0;
  };
  using span = thrust_buffer<T>;
  using const_span = thrust_buffer<const T>;
  static constexpr errc mismatch = errc::collective_mismatch;

  static void resize(buffer& b, std::size_t n) {
    if (b.memory.size() < n) b.memory = dtrain::detail::thrust_space::buffer<T>(n);
    b.size = n;
  }
  static span view(buffer& b) noexcept { return b.memory.span().first(b.size); }
  static auto isend(Comm& c, int peer, std::uint64_t tag, const signature& sig, const_span values) {
    return c.isend(peer, tag, values, sig);
  }
  static auto irecv(Comm& c, int peer, std::uint64_t tag, span values) { return c.irecv(peer, tag, values); }
  static void copy(span dst, const_span src) { dtrain::detail::thrust_space::copy<T>(dst, src, legacy_stream()); }
  static void swap(span a, span b, buffer& scratch) {
    if (a.empty()) return;
    resize(scratch, a.size());
    copy(view(scratch), const_span(a));
    copy(a, const_span(b));
    copy(b, const_span(view(scratch)));
  }
  static void zero(span s) { dtrain::detail::thrust_space::zero<T>(s, legacy_stream()); }
  static void scale(span s, T factor) {
    thrust::transform(dtrain::detail::thrust_space::on(legacy_stream()), s.data(), s.data() + s.size(), s.data(),
                      dtrain::detail::times<T>{factor});
  }
  static std::vector<T> to_host(const_span s) { return dtrain::detail::thrust_space::to_host<T>(s, legacy_stream()); }
  static void from_host(span s, std::span<const T> host) {
    dtrain::detail::thrust_space::upload<T>(s, host, legacy_stream());
  }
  /// The calling thread's device, and making it another thread's (the trainer's communication
  /// thread averages replicas on the device the trainer was built on).
  static int current_device() { return dtrain::detail::thrust_space::current_device(); }
  static void use_device(int device) { dtrain::detail::thrust_space::use_device(device); }

 private:
  static dtrain::detail::thrust_space::stream_handle legacy_stream() noexcept { return {}; }
};

}  // namespace dtrain::pipeline
