#pragma once
/// @file
/// `allreduce::thrust_backend<Model>`: the memory policy of an allreduce trainer whose tensors
/// live where Thrust's device system runs: GPU memory in a CUDA build, host memory under the
/// CPP and OMP systems (the same code, tested without a GPU). host_backend.hpp lists what a
/// backend answers; here each answer is ordered by streams and events:
///  - the model enqueues its kernels on its stream and reports gradient i once the kernels that
///    write it are enqueued; the backend records an event there;
///  - the communication stream waits for a bucket's events before packing it, and the copies
///    are synchronised before the collective (NCCL, or staging) starts on streams of its own;
///  - the updater's per-element rule (`device_updater`) is enqueued on the model's stream, so
///    the next forward pass is ordered after it.
/// 16-bit compression packs, reduces and widens on the device, as the host backend does on the
/// host: the same rounding (g/P to nearest-even half), so the two agree bit for bit where their
/// collectives combine in the same order.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <tuple>
#include <vector>

#include <thrust/transform.h>

#include "dtrain/allreduce/bucket_plan.hpp"
#include "dtrain/concepts/device_model.hpp"
#include "dtrain/core/element.hpp"
#include "dtrain/core/memory_use.hpp"
#include "dtrain/core/reduce_op.hpp"
#include "dtrain/cuda/thrust_space.hpp"
#include "dtrain/reduce/thrust.hpp"
#include "dtrain/updater/device.hpp"

namespace dtrain {

/// A `device_tensor_model` (concepts/device_model.hpp) over this build's Thrust device memory:
/// tensors are `thrust_buffer<value_type>` (a `device_span` in a CUDA build) and `stream()` is a
/// `cudaStream_t` (on the CPU, a tag).
template <class M>
concept device_model = device_tensor_model<M, thrust_buffer, detail::thrust_space::stream_handle>;

}  // namespace dtrain

namespace dtrain::allreduce {

namespace detail {
namespace thrust_space = dtrain::detail::thrust_space;
}  // namespace detail

template <class Model>
class thrust_backend {
 public:
  using value_type = typename Model::value_type;
  using span = thrust_buffer<value_type>;
  template <class Updater>
  using updater_for = device_updater<Updater>;
  static constexpr bool mixed = false;  // a 16-bit device model: not yet
  using master_type = value_type;

  static constexpr std::string_view trainer_name = "allreduce::device_trainer";
  static constexpr bool compresses = true;
  /// Accumulation and clipping are host-only so far (refused with `unsupported`); checkpoints
  /// go through host copies (`download`, `upload`).
  static constexpr bool host_tensors = false;
  static constexpr std::string_view no_compression =
      "16-bit compression needs a collective with float16 and bfloat16 elements";

  void reserve(const bucket_plan& plan) {
    scratch_ = detail::thrust_space::buffer<value_type>(plan.largest_bucket());
    ready_events_.resize(plan.tensor_count());
  }
  span scratch(std::size_t n) noexcept { return scratch_.span().first(n); }

  /// The communication thread works on the device that was current where the trainer was built.
  void bind_thread() { detail::thrust_space::use_device(device_); }
  void settle(Model& model) { detail::thrust_space::synchronize(model.stream()); }
  void gradient_final(Model& model, std::size_t tensor) { ready_events_[tensor].record(model.stream()); }
  void await_gradients(const std::vector<std::size_t>& tensors) {
    for (std::size_t t : tensors) ready_events_[t].make_wait(comm_stream_.get());
  }
  void copy(span to, span from) { detail::thrust_space::copy<value_type>(to, from, comm_stream_.get()); }
  void fence() { detail::thrust_space::synchronize(comm_stream_.get()); }

  template <class Collective>
  std::vector<std::int64_t> allgather_digests(Collective& comm, std::span<const std::int64_t> mine) {
    return detail::thrust_space::allgather_through_device(comm, mine, comm_stream_.get());
  }

  /// Averages `flat` across ranks in `Half` precision: g/P packed on the communication stream,
  /// reduced, widened back (the host backend's `allreduce_compressed`, on the device).
  template <class Half, class Collective>
  void allreduce_compressed(Collective& comm, span flat) {
    auto& packed = std::get<detail::thrust_space::buffer<Half>>(scratch16_);
    if (packed.span().size() < flat.size()) packed = detail::thrust_space::buffer<Half>(flat.size());
    const thrust_buffer<Half> half = packed.span().first(flat.size());
    const auto stream = comm_stream_.get();
    thrust::transform(detail::thrust_space::on(stream), flat.data(), flat.data() + flat.size(), half.data(),
                      dtrain::detail::pack_half<Half, value_type>{1.0f / static_cast<float>(comm.size())});
    detail::thrust_space::synchronize(stream);  // the collective runs on streams of its own
    comm.allreduce(half, reduce_op::sum);
    thrust::transform(detail::thrust_space::on(stream), half.data(), half.data() + half.size(), flat.data(),
                      dtrain::detail::widen_half<Half, value_type>{});
  }

  /// The parameters a checkpoint saves and restores: the model's own.
  span master(Model& model, std::size_t i) { return model.parameters(i); }
  void publish(Model&, std::size_t) noexcept {}
  /// `s` copied to the host after the work enqueued on the model's stream (the updates).
  std::vector<value_type> download(Model& model, span s) {
    return detail::thrust_space::to_host<value_type>(s, model.stream());
  }
  void upload(Model& model, span s, std::span<const value_type> host) {
    detail::thrust_space::upload<value_type>(s, host, model.stream());
  }

  template <class Updater>
  void prepare(device_updater<Updater>& updater, std::size_t elements, Model& model) {
    updater.resize(elements, model.stream());
  }

  template <class Updater>
  void update(device_updater<Updater>& updater, Model& model, std::size_t tensor, std::size_t offset,
              std::uint64_t step) {
    step_info info;
    info.step = step;
    updater.step(model.parameters(tensor), thrust_buffer<const value_type>(model.gradients(tensor)), offset, info,
                 model.stream());
  }

  /// Its buffers: the bucket it packs and 16-bit packing, in the device system's memory.
  memory_use memory() const noexcept {
    memory_use m;
    m.buffers = scratch_.size() * sizeof(value_type) + std::get<0>(scratch16_).size() * sizeof(float16) +
                std::get<1>(scratch16_).size() * sizeof(bfloat16);
    if constexpr (device_resident) m.device = m.buffers;
    return m;
  }
  /// The buffers and the updater's state are device memory (a CUDA build), not host memory.
  static constexpr bool device_resident = THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA;

 private:
  int device_ = detail::thrust_space::current_device();
  detail::thrust_space::owned_stream comm_stream_;
  std::vector<detail::thrust_space::event> ready_events_;  // per tensor, recorded on the model's stream
  detail::thrust_space::buffer<value_type> scratch_;
  std::tuple<detail::thrust_space::buffer<float16>, detail::thrust_space::buffer<bfloat16>> scratch16_;
};

}  // namespace dtrain::allreduce
