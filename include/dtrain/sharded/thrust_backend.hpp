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
/// A 16-bit model's master slice, averaged gradient and state are `float`: packing converts with
/// `element_cast`, the host's rounding, so the two backends agree where their sums do. A
/// loss-scaled step's verdict is `dtrain::keep_step`'s, computed on the device: whether the slice
/// is finite, agreed by a max over every group, then the slice unscaled.

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include <thrust/for_each.h>
#include <thrust/transform.h>

#include "dtrain/allreduce/bucket_plan.hpp"
#include "dtrain/allreduce/thrust_backend.hpp"
#include "dtrain/concepts/device_unit_model.hpp"
#include "dtrain/concepts/floating_element.hpp"
#include "dtrain/concepts/updater.hpp"
#include "dtrain/core/element.hpp"
#include "dtrain/core/reduce_op.hpp"
#include "dtrain/cuda/thrust_space.hpp"
#include "dtrain/reduce/thrust.hpp"
#include "dtrain/sharded/options.hpp"
#include "dtrain/updater/device.hpp"
#include "dtrain/updater/loss_scaler.hpp"

namespace dtrain::sharded {

namespace detail {
/// element_cast<To> as a device functor: the host's rounding, on either side.
template <class To>
struct cast_to {
  template <class From>
  DTRAIN_HOST_DEVICE To operator()(From v) const {
    return element_cast<To>(v);
  }
};
/// Sets `*flag` to 1 for an inf or NaN (every writer writes the same value). A for_each, not
/// thrust::all_of: a reduction's kernel names cuda::std types, which nvcc's stub cannot resolve
/// where a user's file says `using namespace dtrain` (dtrain::cuda).
template <class T>
struct flag_non_finite {
  std::int64_t* flag;
  DTRAIN_HOST_DEVICE void operator()(T v) const {
#ifdef __CUDA_ARCH__
    if (!isfinite(v)) *flag = 1;
#else
    if (!std::isfinite(v)) *flag = 1;
#endif
  }
};
}  // namespace detail

/// What stage 3 on Thrust's device memory gives a unit model's pass: `unit_access` of device spans.
template <class T>
using device_unit_access = unit_access<T, thrust_buffer<const T>, thrust_buffer<T>>;

/// A unit model for ZeRO stage 3 on Thrust's device memory in this build.
template <class M>
concept device_unit_model = device_unit_tensor_model<M, thrust_buffer, dtrain::detail::thrust_space::stream_handle>;

template <class Model>
  requires floating_element<typename Model::value_type>
class thrust_backend {
 public:
  using value_type = typename Model::value_type;
  using master_type = compute_type_t<value_type>;
  template <class T>
  using span = thrust_buffer<T>;
  template <class T>
  using buffer = dtrain::detail::thrust_space::buffer<T>;
  template <class Updater>
  using updater_for = device_updater<Updater>;

  static constexpr std::string_view trainer_name = "sharded::device_trainer";
  static constexpr bool device_resident = THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA;

  template <class T>
  static buffer<T> allocate(std::size_t n) {
    return buffer<T>(n);
  }
  template <class T>
  static span<T> whole(buffer<T>& b) noexcept {
    return b.span();
  }

  /// `n` zeros, written on the model's stream before its next work.
  template <class T>
  buffer<T> zeros(std::size_t n, Model& model) {
    buffer<T> b(n);
    dtrain::detail::thrust_space::zero<T>(b.span(), model.stream());
    return b;
  }
  /// The communication thread works on the device that was current where the trainer was built.
  void bind_thread() { dtrain::detail::thrust_space::use_device(device_); }

  void settle(Model& model) { dtrain::detail::thrust_space::synchronize(model.stream()); }
  void gradient_final(Model& model, std::size_t tensor) { ready_events_[tensor].record(model.stream()); }
  void await_gradients(const std::vector<std::size_t>& tensors) {
    for (std::size_t t : tensors) ready_events_[t].make_wait(stream());
  }
  void fence() { dtrain::detail::thrust_space::synchronize(stream()); }

  /// Bucket `b`'s tensors into `flat` in plan order, and zeros after them (as `allreduce::pack`).
  template <class T, class Tensor>
  void pack(const allreduce::bucket& b, Tensor&& tensor, span<T> flat) {
    for (std::size_t k = 0; k < b.tensors.size(); ++k) {
      const span<value_type> t = tensor(b.tensors[k]);
      convert(span<const value_type>(t), flat.subspan(b.offsets[k], t.size()));
    }
    dtrain::detail::thrust_space::zero<T>(flat.subspan(b.elements), stream());
  }
  template <class T, class Tensor>
  void unpack(const allreduce::bucket& b, span<const T> flat, Tensor&& tensor) {
    for (std::size_t k = 0; k < b.tensors.size(); ++k) {
      const span<value_type> t = tensor(b.tensors[k]);
      convert(flat.subspan(b.offsets[k], t.size()), t);
    }
  }
  /// `from` into `to`, each element `element_cast` (a plain copy where the types are one).
  template <class From, class To>
  void convert(span<From> from, span<To> to) {
    if constexpr (std::same_as<std::remove_const_t<From>, To>) {
      dtrain::detail::thrust_space::copy<To>(to, from, stream());
    } else {
      thrust::transform(dtrain::detail::thrust_space::on(stream()), from.data(), from.data() + from.size(), to.data(),
                        detail::cast_to<To>{});
    }
  }

  /// A checkpoint's host copy of `s`, after the work enqueued before it; and back, complete when
  /// it returns.
  template <class T>
  std::vector<T> to_host(span<const T> s) {
    return dtrain::detail::thrust_space::to_host<T>(s, stream());
  }
  template <class T>
  void from_host(span<T> s, std::span<const T> values) {
    dtrain::detail::thrust_space::upload<T>(s, values, stream());
  }

  /// `dtrain::keep_step` on the device: the verdict on this rank's `gradient` slice, agreed by
  /// every rank of `comm` (and `replicas`), and a good step's slice unscaled. Collective.
  template <class Collective, class Replicas>
  bool keep_step(Collective& comm, Replicas& replicas, loss_scaler& scaler, span<master_type> gradient) {
    if (!scaler.enabled()) return true;
    const auto on = dtrain::detail::thrust_space::on(stream());
    if (flag_.size() == 0) flag_ = buffer<std::int64_t>(1);  // once, not a device allocation per step
    dtrain::detail::thrust_space::zero<std::int64_t>(flag_.span(), stream());
    thrust::for_each(on, gradient.data(), gradient.data() + gradient.size(),
                     detail::flag_non_finite<master_type>{flag_.data()});
    fence();
    comm.allreduce(flag_.span(), reduce_op::max);
    if constexpr (sharded::detail::has_replicas<Replicas>) replicas.allreduce(flag_.span(), reduce_op::max);
    std::int64_t overflow = 0;
    dtrain::detail::thrust_space::download<std::int64_t>(std::span<std::int64_t>(&overflow, 1), flag_.span(),
                                                         stream());
    const auto inverse = static_cast<master_type>(1.0 / scaler.scale());
    if (!scaler.update(overflow == 0)) return false;
    thrust::transform(on, gradient.data(), gradient.data() + gradient.size(), gradient.data(),
                      dtrain::detail::times<master_type>{inverse});
    fence();
    return true;
  }

  template <class Updater>
  void prepare(device_updater<Updater>& updater, std::size_t elements, Model& model, std::size_t ready_points) {
    updater.resize(elements, model.stream());
    ready_events_.resize(ready_points);
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

  template <class Collective>
  std::vector<std::int64_t> allgather_digests(Collective& comm, std::span<const std::int64_t> mine) {
    return dtrain::detail::thrust_space::allgather_through_device(comm, mine, stream());
  }

 private:
  auto stream() const noexcept { return comm_stream_.get(); }

  int device_ = dtrain::detail::thrust_space::current_device();
  dtrain::detail::thrust_space::owned_stream comm_stream_;
  std::vector<dtrain::detail::thrust_space::event> ready_events_;  // per tensor, on the model's stream
  buffer<std::int64_t> flag_;  // a loss-scaled step's verdict: 1 where some slice holds an inf or NaN
};

}  // namespace dtrain::sharded
