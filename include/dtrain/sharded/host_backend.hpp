#pragma once
/// @file
/// `sharded::host_backend<Model>`: the memory policy of a sharded trainer (stages 1 and 2) whose
/// model's tensors are `std::span`s of host memory: buffers are vectors, packing converts as it
/// copies (a 16-bit model's gradients into float), nothing needs ordering, and the updater steps
/// the master slice in place. thrust_backend.hpp is the same policy on Thrust's device memory.
///
/// A sharded trainer's backend (`basic_trainer`'s first template argument) answers:
///  - `master_type`, `span<T>`, `buffer<T>` (`allocate<T>(n)`, `whole(b)`), `updater_for<U>`;
///  - `pack` and `unpack` of a bucket between the model's tensors and a flat span, `convert`
///    between spans, and `fence()`: what was copied is there before a collective reads it;
///  - `settle(model)`: the model's enqueued work is done (its parameters are final);
///  - `gradient_final(model, i)` and `await_gradients(points)`: a bucket is packed only once
///    the model has produced its gradients (`ready_points` of them);
///  - `zeros<T>(n, model)`: a zeroed buffer, in place before the model's next work;
///  - `bind_thread()`: run first on the communication thread (the device the trainer uses);
///  - `prepare(updater, n, model, ready_points)` and `update(updater, model, master, gradient, step)`;
///  - `keep_step(comm, replicas, scaler, gradient)`: a loss-scaled step's verdict, agreed by
///    every rank (`dtrain::keep_step`), and a good step's slice unscaled;
///  - `allgather_digests(comm, mine)`: every rank's start-up digest, in host memory;
///  - `to_host(s)` and `from_host(s, values)`: a checkpoint's host copy of a slice, and back;
///  - `device_resident`: its buffers and the updater's state are device memory.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "dtrain/allreduce/bucket_plan.hpp"
#include "dtrain/concepts/updater.hpp"
#include "dtrain/core/element.hpp"
#include "dtrain/detail/allgather_on_host.hpp"
#include "dtrain/sharded/agreement.hpp"
#include "dtrain/updater/loss_scaler.hpp"

namespace dtrain::sharded {

template <class Model>
class host_backend {
 public:
  using value_type = typename Model::value_type;
  using master_type = compute_type_t<value_type>;
  template <class T>
  using span = std::span<T>;
  template <class T>
  using buffer = std::vector<T>;
  template <class Updater>
  using updater_for = Updater;

  static constexpr std::string_view trainer_name = "sharded::trainer";
  static constexpr bool device_resident = false;

  template <class T>
  static buffer<T> allocate(std::size_t n) {
    return buffer<T>(n);
  }
  template <class T>
  static span<T> whole(buffer<T>& b) noexcept {
    return span<T>(b);
  }

  void settle(Model&) noexcept {}
  void gradient_final(Model&, std::size_t) noexcept {}
  void await_gradients(const std::vector<std::size_t>&) noexcept {}
  void fence() noexcept {}

  template <class T, class Tensor>
  void pack(const allreduce::bucket& b, Tensor&& tensor, span<T> flat) {
    allreduce::pack<T>(b, tensor, flat);
  }
  template <class T, class Tensor>
  void unpack(const allreduce::bucket& b, span<const T> flat, Tensor&& tensor) {
    allreduce::unpack<T>(b, flat, tensor);
  }
  template <class From, class To>
  void convert(span<From> from, span<To> to) {
    dtrain::convert(from, to);
  }

  template <class T>
  std::vector<T> to_host(span<const T> s) const {
    return {s.begin(), s.end()};
  }
  template <class T>
  void from_host(span<T> s, std::span<const T> values) const {
    std::copy(values.begin(), values.end(), s.begin());
  }

  template <class T>
  static buffer<T> zeros(std::size_t n, Model&) {
    return buffer<T>(n);
  }
  void bind_thread() noexcept {}

  template <class Updater>
  void prepare(Updater& updater, std::size_t elements, Model&, std::size_t) {
    updater.resize(elements);
  }
  template <class Updater>
  void update(Updater& updater, Model&, span<master_type> master, span<const master_type> gradient,
              std::uint64_t step) {
    step_info info;
    info.step = step;
    updater.step(master, gradient, 0, info);
  }

  template <class Collective, class Replicas>
  bool keep_step(Collective& comm, Replicas& replicas, loss_scaler& scaler, span<master_type> gradient) {
    return sharded::keep_step(comm, replicas, scaler, gradient);
  }

  template <class Collective>
  std::vector<std::int64_t> allgather_digests(Collective& comm, std::span<const std::int64_t> mine) {
    return dtrain::detail::allgather_on_host(comm, mine);
  }
};

}  // namespace dtrain::sharded
