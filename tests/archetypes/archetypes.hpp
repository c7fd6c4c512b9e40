#pragma once
// Minimal models of each concept: they have exactly what the concept requires and nothing more,
// so the concept tests prove that the requirements are sufficient, and the broken variants
// prove each clause is checked.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <system_error>
#include <vector>

#include "dtrain/concepts/completion.hpp"
#include "dtrain/concepts/consistency.hpp"
#include "dtrain/concepts/model.hpp"
#include "dtrain/concepts/stage.hpp"
#include "dtrain/concepts/transport.hpp"
#include "dtrain/concepts/unit_model.hpp"
#include "dtrain/concepts/updater.hpp"
#include "dtrain/core/memory_space.hpp"
#include "dtrain/core/reduce_op.hpp"

namespace dtrain::archetypes {

struct completion_archetype {
  completion_archetype() = default;
  completion_archetype(completion_archetype&&) = default;
  completion_archetype& operator=(completion_archetype&&) = default;
  bool wait(deadline, std::error_code&) noexcept { return true; }
  void wait(deadline) {}
  bool test() noexcept { return true; }
  void cancel() noexcept {}
  const envelope& info() const noexcept { return env_; }
  envelope env_;
};

struct transport_archetype {
  using memory_space = host_memory;
  int rank() const noexcept { return 0; }
  int size() const noexcept { return 1; }
  completion_archetype isend(int, std::uint64_t, const signature&, std::span<const std::byte>) { return {}; }
  completion_archetype irecv(int, std::uint64_t, std::span<std::byte>) { return {}; }
  completion_archetype irecv(int, std::uint64_t, std::vector<std::byte>&) { return {}; }
  completion_archetype isend(int, std::uint64_t, const signature&, gather_list) { return {}; }
  completion_archetype irecv(int, std::uint64_t, scatter_list, std::vector<std::byte>*) { return {}; }
};

template <class T>
using host_span_t = std::span<T>;

// The collective operations over buffers of type Span<T> in memory space `Space`.
template <template <class> class Span, class Space>
struct basic_collective_archetype {
  using memory_space = Space;
  int rank() const noexcept { return 0; }
  int size() const noexcept { return 1; }
  template <class T> void broadcast(Span<T>, int) {}
  template <class T> void broadcast(Span<T>, int, std::error_code&) noexcept {}
  template <class T> void gather(Span<const T>, Span<T>, int) {}
  template <class T> void gather(Span<const T>, Span<T>, int, std::error_code&) noexcept {}
  template <class T> void scatter(Span<const T>, Span<T>, int) {}
  template <class T> void scatter(Span<const T>, Span<T>, int, std::error_code&) noexcept {}
  template <class T> void reduce(Span<const T>, Span<T>, reduce_op, int) {}
  template <class T> void reduce(Span<const T>, Span<T>, reduce_op, int, std::error_code&) noexcept {}
  template <class T> void reduce(Span<T>, reduce_op, int) {}
  template <class T> void allreduce(Span<const T>, Span<T>, reduce_op) {}
  template <class T> void allreduce(Span<const T>, Span<T>, reduce_op, std::error_code&) noexcept {}
  template <class T> void allreduce(Span<T>, reduce_op) {}
  template <class T> void allreduce(Span<T>, reduce_op, std::error_code&) noexcept {}
  template <class T> void reduce_scatter(Span<const T>, Span<T>, reduce_op) {}
  template <class T> void reduce_scatter(Span<const T>, Span<T>, reduce_op, std::error_code&) noexcept {}
  template <class T> void reduce_scatter(Span<T>, reduce_op) {}
  template <class T> void allgather(Span<const T>, Span<T>) {}
  template <class T> void allgather(Span<const T>, Span<T>, std::error_code&) noexcept {}
  template <class T> void allgather(Span<T>) {}
  template <class T> void alltoall(Span<const T>, Span<T>) {}
  template <class T> void alltoall(Span<const T>, Span<T>, std::error_code&) noexcept {}
  template <class T> void alltoall(Span<T>) {}
  void barrier() {}
  void barrier(std::error_code&) noexcept {}
};

using collective_archetype = basic_collective_archetype<host_span_t, host_memory>;
/// A collective over device memory (NCCL's shape).
using device_collective_archetype = basic_collective_archetype<device_span, device_memory>;

struct reduction_archetype {
  using memory_space = host_memory;
  template <class T> void operator()(std::span<T>, std::span<const T>, reduce_op) const {}
  template <class T> void finish_average(std::span<T>, int) const {}
};

struct consistency_archetype {
  static constexpr std::string_view name = "archetype";
  std::int64_t staleness_bound() const noexcept { return 0; }
  bool may_advance(std::int64_t, std::int64_t) const noexcept { return true; }
  int pushes_to_apply(int) const noexcept { return 1; }
  std::int64_t visible_clock(std::int64_t) const noexcept { return -1; }
};

struct updater_archetype {
  static constexpr std::string_view name = "archetype";
  static constexpr std::size_t state_slots = 0;
  void resize(std::size_t) {}
  void step(std::span<float>, std::span<const float>, std::size_t, step_info) {}
  std::size_t parameters() const noexcept { return 0; }
  std::span<float> state() noexcept { return {}; }
  double learning_rate() const noexcept { return 0; }
  void set_learning_rate(double) noexcept {}
};

struct model_archetype {
  using value_type = float;
  struct batch_type {};
  std::size_t tensor_count() const noexcept { return 0; }
  std::span<float> parameters(std::size_t) { return {}; }
  std::span<float> gradients(std::size_t) { return {}; }
  double forward_backward(const batch_type&, gradient_ready) { return 0; }
};

struct unit_model_archetype {
  using value_type = float;
  struct batch_type {};
  std::size_t unit_count() const noexcept { return 0; }
  std::vector<std::size_t> unit_tensors(std::size_t) const { return {}; }
  void initialize(std::size_t, std::size_t, std::span<float>) {}
  double forward_backward(const batch_type&, unit_access<float>&) { return 0; }
};

struct stage_archetype {
  using value_type = double;
  std::size_t tensor_count() const noexcept { return 0; }
  std::span<double> parameters(std::size_t) { return {}; }
  std::span<double> gradients(std::size_t) { return {}; }
  std::size_t input_size() const noexcept { return 0; }
  std::size_t output_size() const noexcept { return 0; }
  double forward(const micro_batch&, std::span<const double>, std::span<double>) { return 0; }
  void backward(const micro_batch&, std::span<const double>, std::span<double>) {}
  void discard(const micro_batch&) {}
};

}  // namespace dtrain::archetypes
