#pragma once
/// @file
/// The `device_unit_tensor_model` concept: a `unit_model` whose gathered parameters and gradients
/// live in a device's memory and whose kernels run on a stream, for ZeRO stage 3 on the device
/// (`sharded::device_trainer<..., zero3, ...>`, which binds it to Thrust's device memory in that
/// build as `device_unit_model`).

#include <concepts>
#include <cstddef>
#include <span>
#include <vector>

#include "dtrain/concepts/floating_element.hpp"
#include "dtrain/concepts/unit_model.hpp"

namespace dtrain {

/// A unit model on a device: what `unit_model` says, with these differences.
///  - `units.parameters(u, k)` and `units.gradients(u, k)` are `Buffer`s of device memory.
///  - `m.stream()` is the stream its kernels run on; `forward_backward` enqueues on it.
///  - `forward_done(u)` and `backward_done(u)` may come as soon as the unit's kernels are
///    *enqueued*: the trainer waits for them before it frees or reduces the unit's buffers.
///  - `m.initialize(u, k, w)` fills host memory, as for `unit_model` (once, on the root).
template <class M, template <class> class Buffer, class Stream>
concept device_unit_tensor_model =
    floating_element<typename M::value_type> && requires { typename M::batch_type; } &&
    requires(M& m, const M& cm, std::size_t u, std::span<compute_type_t<typename M::value_type>> w,
             const typename M::batch_type& batch,
             unit_access<typename M::value_type, Buffer<const typename M::value_type>,
                         Buffer<typename M::value_type>>& units) {
      { cm.unit_count() } noexcept -> std::same_as<std::size_t>;
      { cm.unit_tensors(u) } -> std::convertible_to<std::vector<std::size_t>>;
      { m.initialize(u, u, w) } -> std::same_as<void>;
      { m.stream() } -> std::convertible_to<Stream>;
      { m.forward_backward(batch, units) } -> std::convertible_to<double>;
    };

}  // namespace dtrain
