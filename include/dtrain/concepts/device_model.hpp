#pragma once
/// @file
/// The `device_tensor_model` concept: a model whose tensors live in a device's memory and whose
/// kernels run on a stream, for `allreduce::device_trainer` (which binds it to Thrust's device
/// memory in that build as `device_model`).

#include <concepts>
#include <cstddef>

#include "dtrain/concepts/floating_element.hpp"
#include "dtrain/concepts/model.hpp"

namespace dtrain {

/// A model whose tensors are `Buffer<value_type>` views of device memory, run on a `Stream`.
///  1-3. As `model`: `value_type`, `batch_type`, `tensor_count()`.
///  4. `m.parameters(i)` / `m.gradients(i)` are `Buffer<value_type>`, equal in size, at fixed
///     addresses for the model's lifetime.
///  5. `m.stream()` is the stream its kernels run on.
///  6. `m.forward_backward(batch, ready)` enqueues forward and backward on `stream()`, overwriting
///     every gradient with the batch's mean gradient, and returns the mean loss. It calls `ready(i)`
///     once per tensor, as soon as the kernels writing gradient i are *enqueued*; after that it
///     enqueues nothing that touches gradient i.
template <class M, template <class> class Buffer, class Stream>
concept device_tensor_model =
    floating_element<typename M::value_type> && requires { typename M::batch_type; } &&
    requires(M& m, const M& cm, std::size_t i, const typename M::batch_type& batch, gradient_ready ready) {
      { cm.tensor_count() } noexcept -> std::same_as<std::size_t>;
      { m.parameters(i) } -> std::same_as<Buffer<typename M::value_type>>;
      { m.gradients(i) } -> std::same_as<Buffer<typename M::value_type>>;
      { m.stream() } -> std::convertible_to<Stream>;
      { m.forward_backward(batch, ready) } -> std::convertible_to<double>;
    };

}  // namespace dtrain
