#pragma once
/// @file
/// `sharded::thrust_backend<Model>`: the memory policy of a sharded trainer whose model's tensors
/// live where Thrust's device system runs (GPU memory in a CUDA build, host memory under the CPP
/// and OMP systems: the same code, tested without a GPU). host_backend.hpp lists what a backend
/// answers; here the order comes from streams and events, as in the allreduce device trainer:
///  - the model reports gradient i once its kernels are enqueued; an event is recorded there, and
///    the communication stream waits for a bucket's events before packing it;
///  - packing, slicing and unpacking are copies on the communication stream, which `fence()`
///    completes before a collective (NCCL, or staging) starts on streams of its own;
///  - the updater's rule (`device_updater`) runs on the model's stream over this rank's slice,
///    and is complete before the slices are gathered.
/// A 16-bit device model (a float master copy on the device) is not built yet.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "dtrain/allreduce/bucket_plan.hpp"
#include "dtrain/concepts/updater.hpp"
#include "dtrain/cuda/thrust_space.hpp"
#include "dtrain/updater/device.hpp"

namespace dtrain::sharded {

template <class Model>
  requires std::floating_point<typename Model::value_type>
class thrust_backend {
 public:
  using value_type = typename Model::value_type;
  using master_type = value_type;
  template <class T>
  using span = thrust_buffer<T>;
  template <class T>
  using buffer = dtrain::detail::thrust_space::buffer<T>;
  template <class Updater>
  using updater_for = device_updater<Updater>;

  static constexpr std::string_view trainer_name = "sharded::device_trainer";
  static constexpr bool host_tensors = false;
  static constexpr bool device_resident = THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA;

  template <class T>
  static buffer<T> allocate(std::size_t n) {
    return buffer<T>(n);
  }
  template <class T>
  static span<T> whole(buffer<T>& b) noexcept {
    return b.span();
  }

  void gradient_final(Model& model, std::size_t tensor) { ready_events_[tensor].record(model.stream()); }
  void await_gradients(const std::vector<std::size_t>& tensors) {
    for (std::size_t t : tensors) ready_events_[t].make_wait(stream());
  }
  void fence() { dtrain::detail::thrust_space::synchronize(stream()); }

  /// Bucket `b`'s tensors into `flat` in plan order, and zeros after them (as `allreduce::pack`).
  template <class T, class Tensor>
  void pack(const allreduce::bucket& b, Tensor&& tensor, span<T> flat) {
    for (std::size_t k = 0; k < b.tensors.size(); ++k) {
      const span<T> t = tensor(b.tensors[k]);
      copy<T>(flat.subspan(b.offsets[k], t.size()), t);
    }
    dtrain::detail::thrust_space::zero<T>(flat.subspan(b.elements), stream());
  }
  template <class T, class Tensor>
  void unpack(const allreduce::bucket& b, span<const T> flat, Tensor&& tensor) {
    for (std::size_t k = 0; k < b.tensors.size(); ++k) {
      const span<T> t = tensor(b.tensors[k]);
      copy<T>(t, flat.subspan(b.offsets[k], t.size()));
    }
  }
  /// One precision on the device: a copy.
  template <class From, class To>
    requires std::same_as<std::remove_const_t<From>, To>
  void convert(span<From> from, span<To> to) {
    copy<To>(to, from);
  }

  template <class Updater>
  void prepare(device_updater<Updater>& updater, std::size_t elements, Model& model) {
    updater.resize(elements, model.stream());
    ready_events_.resize(model.tensor_count());
  }
  /// The rule over this rank's slice on the model's stream; complete when it returns, since the
  /// gathers that follow read the slice on the communication stream.
  template <class Updater>
  void update(device_updater<Updater>& updater, Model& model, span<master_type> master,
              span<const master_type> gradient, std::uint64_t step) {
    step_info info;
    info.step = step;
    updater.step(master, gradient, 0, info, model.stream());
    dtrain::detail::thrust_space::synchronize(model.stream());
  }

  /// Through device memory: the collective takes no other.
  template <class Collective>
  std::vector<std::int64_t> allgather_digests(Collective& comm, std::span<const std::int64_t> mine) {
    const auto n = static_cast<std::size_t>(comm.size());
    buffer<std::int64_t> in(mine.size()), out(mine.size() * n);
    dtrain::detail::thrust_space::upload<std::int64_t>(in.span(), mine, stream());
    comm.allgather(thrust_buffer<const std::int64_t>(in.span()), out.span());
    std::vector<std::int64_t> all(mine.size() * n);
    dtrain::detail::thrust_space::download<std::int64_t>(all, out.span(), stream());
    return all;
  }

 private:
  auto stream() const noexcept { return comm_stream_.get(); }
  template <class T>
  void copy(span<T> to, span<const T> from) {
    dtrain::detail::thrust_space::copy<T>(to, from, stream());
  }

  dtrain::detail::thrust_space::owned_stream comm_stream_;
  std::vector<dtrain::detail::thrust_space::event> ready_events_;  // per tensor, on the model's stream
};

}  // namespace dtrain::sharded
