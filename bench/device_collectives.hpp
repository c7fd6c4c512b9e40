#pragma once
// One collective on device buffers, timed: shared by bench_device_collectives' NCCL path (host
// C++) and its staged path (device_collectives_staged.cu, nvcc). No fmt or CLI11 here.
//
// Inputs are small integers (rank r, element i: r + 1 + i % 7), so every result is exact in float
// and is checked against a host reference after the timed calls (#wrong).

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/memory_space.hpp"
#include "dtrain/core/reduce_op.hpp"
#include "dtrain/core/signature.hpp"
#include "dtrain/cuda/runtime.hpp"
#include "dtrain/transport/any.hpp"

namespace dtrain::bench {

/// The result of one point on this rank.
struct device_point {
  coll_op op = coll_op::allreduce;
  std::size_t count = 0;  ///< elements per call (per rank's block for block collectives)
  std::size_t bytes = 0;  ///< bytes of the larger buffer, as nccl-tests counts them
  double seconds = 0;     ///< mean per call, the slowest rank's
  long wrong = 0;         ///< wrong elements on this rank
  std::string algo;       ///< what ran, where one op has several rows (empty: the collective's name)
};

/// What the staged path runs (device_collectives_staged.cu): every op, every size (`message`:
/// point-to-point, `measure_p2p`).
struct device_plan {
  std::vector<coll_op> ops;
  std::vector<std::size_t> sizes;  ///< bytes
  int warmup = 5, iterations = 20;
};

/// Runs `plan` on TCP-staged device buffers over `t`: one point per (op, size), in order.
std::vector<device_point> run_staged(any_transport t, const device_plan& plan);

namespace detail {

inline float input_of(int rank, std::size_t i) { return static_cast<float>(rank + 1 + static_cast<int>(i % 7)); }

// The last request of calls left in flight (collectives with `i*` forms): waiting for it, under
// the communicator's deadline, waits for every earlier one on the same stream.
template <class Comm>
struct last_request {
  void wait() {}
};
template <class Comm>
  requires requires { typename Comm::request; }
struct last_request<Comm> {
  typename Comm::request request;
  void wait() { request.wait(); }
};

// The slowest rank's `seconds`, through the collective itself.
template <class Comm>
double slowest(Comm& c, double seconds) {
  cuda::device_buffer<float> value(1);
  const float mine = static_cast<float>(seconds);
  cuda::check(cudaMemcpy(value.data(), &mine, sizeof mine, cudaMemcpyHostToDevice), "H2D");
  c.allreduce(value.span(), reduce_op::max);
  float all = 0;
  cuda::check(cudaMemcpy(&all, value.data(), sizeof all, cudaMemcpyDeviceToHost), "D2H");
  return static_cast<double>(all);
}

inline std::vector<float> download(const cuda::device_buffer<float>& d) {
  std::vector<float> h(d.size());
  cuda::check(cudaMemcpy(h.data(), d.data(), d.size() * sizeof(float), cudaMemcpyDeviceToHost), "D2H");
  return h;
}

}  // namespace detail

/// Times `op` on `bytes` of floats with collective `c` (device buffers), checks the result.
/// `in_flight`: allreduce through `iallreduce`, every call enqueued before the last is waited for
/// (as nccl-tests times), instead of one blocking call after another.
template <class Comm>
device_point measure_device(Comm& c, coll_op op, std::size_t bytes, int warmup, int iterations,
                            bool in_flight = false) {
  const int p = c.size(), r = c.rank();
  const auto P = static_cast<std::size_t>(p);
  const bool blocks = op == coll_op::allgather || op == coll_op::reduce_scatter || op == coll_op::alltoall;
  const std::size_t total = bytes / sizeof(float);
  const std::size_t count = blocks ? std::max<std::size_t>(1, total / P) : std::max<std::size_t>(1, total);
  const std::size_t n = blocks ? count * P : count;
  const std::size_t in_n = op == coll_op::allgather ? count : n;
  const std::size_t out_n = op == coll_op::reduce_scatter ? count : n;
  std::vector<float> host_in(in_n);
  for (std::size_t i = 0; i < in_n; ++i) host_in[i] = detail::input_of(r, i);
  cuda::device_buffer<float> in(in_n), out(out_n);
  cuda::check(cudaMemcpy(in.data(), host_in.data(), in_n * sizeof(float), cudaMemcpyHostToDevice), "H2D");
  detail::last_request<Comm> last;
  auto call = [&] {
    if constexpr (requires {
                    last.request = c.iallreduce(device_span<const float>(in.span()), out.span(), reduce_op::sum);
                  }) {
      if (in_flight && op == coll_op::allreduce) {
        last.request = c.iallreduce(device_span<const float>(in.span()), out.span(), reduce_op::sum);
        return;
      }
    }
    switch (op) {
      case coll_op::allreduce:
        c.allreduce(device_span<const float>(in.span()), out.span(), reduce_op::sum);
        break;
      case coll_op::allgather:
        c.allgather(device_span<const float>(in.span()), out.span());
        break;
      case coll_op::reduce_scatter:
        c.reduce_scatter(device_span<const float>(in.span()), out.span(), reduce_op::sum);
        break;
      case coll_op::alltoall:
        c.alltoall(device_span<const float>(in.span()), out.span());
        break;
      case coll_op::broadcast:
        cuda::check(cudaMemcpy(out.data(), in.data(), n * sizeof(float), cudaMemcpyDeviceToDevice), "D2D");
        c.broadcast(out.span(), 0);
        break;
      default:
        throw error(errc::invalid_argument, "bench_device_collectives: no device form of this collective here");
    }
  };
  for (int k = 0; k < warmup; ++k) call();
  last.wait();
  cuda::check(cudaDeviceSynchronize(), "sync");
  const auto t0 = std::chrono::steady_clock::now();
  for (int k = 0; k < iterations; ++k) call();
  last.wait();
  cuda::check(cudaDeviceSynchronize(), "sync");
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iterations;

  // The reference, from the inputs' closed form.
  const std::vector<float> got = detail::download(out);
  long wrong = 0;
  for (std::size_t i = 0; i < out_n; ++i) {
    float want = 0;
    switch (op) {
      case coll_op::allreduce:
        for (int q = 0; q < p; ++q) want += detail::input_of(q, i);
        break;
      case coll_op::reduce_scatter:
        for (int q = 0; q < p; ++q) want += detail::input_of(q, static_cast<std::size_t>(r) * count + i);
        break;
      case coll_op::allgather: want = detail::input_of(static_cast<int>(i / count), i % count); break;
      case coll_op::alltoall:
        want = detail::input_of(static_cast<int>(i / count), static_cast<std::size_t>(r) * count + i % count);
        break;
      default: want = detail::input_of(0, i); break;  // broadcast from rank 0
    }
    wrong += got[i] == want ? 0 : 1;
  }
  return {op, count, std::max(in_n, out_n) * sizeof(float), detail::slowest(c, seconds), wrong, {}};
}

/// Point-to-point between the rank pairs (0, 1), (2, 3), ... through `c`'s `send`/`recv`: the
/// one-way time of a message (half a ping-pong's round trip), checked; then, in the same run, the
/// staging alone: a `cudaMemcpy` of the same bytes to pinned host memory and back (row
/// "cudaMemcpy round trip"). The op column says `sendrecv`, as nccl-tests' does; the algorithm
/// column `path` ("staged", "nccl").
template <class Comm>
std::vector<device_point> measure_p2p(Comm& c, const char* path, std::size_t bytes, int warmup, int iterations) {
  const int r = c.rank(), peer = r ^ 1;
  if (peer >= c.size()) throw error(errc::invalid_argument, "sendrecv pairs the ranks: run an even number of them");
  const std::size_t n = std::max<std::size_t>(1, bytes / sizeof(float));
  std::vector<float> host_in(n);
  for (std::size_t i = 0; i < n; ++i) host_in[i] = detail::input_of(r, i);
  cuda::device_buffer<float> in(n), out(n);
  cuda::check(cudaMemcpy(in.data(), host_in.data(), n * sizeof(float), cudaMemcpyHostToDevice), "H2D");
  auto ping_pong = [&] {
    if (r % 2 == 0) c.send(peer, 1, in.span());
    c.recv(peer, 1, out.span());
    if (r % 2 == 1) c.send(peer, 1, in.span());
  };
  auto timed = [&](auto&& f) {
    for (int k = 0; k < warmup; ++k) f();
    cuda::check(cudaDeviceSynchronize(), "sync");
    const auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < iterations; ++k) f();
    cuda::check(cudaDeviceSynchronize(), "sync");
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iterations;
  };
  const double one_way = timed(ping_pong) / 2;
  const std::vector<float> got = detail::download(out);
  long wrong = 0;
  for (std::size_t i = 0; i < n; ++i) wrong += got[i] == detail::input_of(peer, i) ? 0 : 1;
  cuda::pinned_buffer<float> staging(n);
  const double memcpy_round_trip = timed([&] {
    cuda::check(cudaMemcpy(staging.data(), in.data(), n * sizeof(float), cudaMemcpyDeviceToHost), "D2H");
    cuda::check(cudaMemcpy(out.data(), staging.data(), n * sizeof(float), cudaMemcpyHostToDevice), "H2D");
  });
  return {{coll_op::message, n, n * sizeof(float), detail::slowest(c, one_way), wrong, path},
          {coll_op::message, n, n * sizeof(float), detail::slowest(c, memcpy_round_trip), 0, "cudaMemcpy round trip"}};
}

}  // namespace dtrain::bench
