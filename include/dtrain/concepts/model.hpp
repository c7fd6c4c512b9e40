#pragma once
/// @file
/// The `model` concept: what a user's model gives a data-parallel trainer. No framework is
/// assumed: a model is anything that exposes its parameter and gradient tensors as contiguous
/// buffers and runs forward/backward on a batch, saying when each gradient is final.

#include <concepts>
#include <cstddef>
#include <span>
#include <type_traits>

#include "dtrain/concepts/floating_element.hpp"

namespace dtrain {

/// A non-owning reference to the trainer's "gradient of tensor i is final" callback, passed to
/// `model::forward_backward`. Cheap to copy; valid only during that call.
class gradient_ready {
 public:
  /// Refers to `f`, callable as `f(std::size_t)`; `f` must outlive every use of this object.
  template <class F>
    requires(!std::same_as<std::remove_cvref_t<F>, gradient_ready> &&
             std::invocable<F&, std::size_t>)
  gradient_ready(F& f) noexcept  // NOLINT(google-explicit-constructor): a parameter type
      : object_(&f), call_([](void* o, std::size_t tensor) { (*static_cast<F*>(o))(tensor); }) {}

  /// Reports that tensor `tensor`'s gradient is final for this batch.
  void operator()(std::size_t tensor) const { call_(object_, tensor); }

 private:
  void* object_;
  void (*call_)(void*, std::size_t);
};

/// A model for data-parallel training.
///  1. `M::value_type` is the type of parameters and gradients: a `floating_element` (16-bit
///     types train in mixed precision, with `float` master weights in the trainer).
///  2. `M::batch_type` is whatever one `forward_backward` call consumes (a range of sample
///     indices, a tensor, ...); the trainer only passes it through.
///  3. `m.tensor_count()` is the number of parameter tensors (layers' weights, biases, ...).
///     noexcept; fixed for the model's lifetime.
///  4. `m.parameters(i)` / `m.gradients(i)` view tensor i's parameters and gradient: the same
///     size, contiguous, at addresses that stay valid and fixed for the model's lifetime.
///  5. `m.forward_backward(batch, ready)` runs the forward and backward pass on `batch`,
///     *overwrites* every gradient with the mean gradient of the batch's loss, and returns that
///     mean loss. It calls `ready(i)` exactly once per tensor, as soon as tensor i's gradient is
///     final (backward passes usually go last layer first).
///  Semantics: after `ready(i)` the model must not read or write `gradients(i)` again in this
///  call: the trainer averages it across ranks on its communication thread, in place, while the
///  backward pass goes on. `forward_backward` must not change `parameters(i)`; the trainer
///  updates them between calls. Every rank's model has the same tensors in the same order (the
///  trainer compares their sizes and its bucket plan across ranks at start-up, and fails on
///  every rank if they differ). The order of `ready` calls is free and may differ between ranks
///  and steps: buckets are launched in the plan's order, whatever order they complete in. A
///  tensor reported twice, out of range or never fails the step with `errc::invalid_argument`.
///  Optional: `m.set_loss_scale(s)`, called before each `forward_backward` when the trainer
///  scales the loss (`loss_scaling`): the gradients written are then s times the mean gradient
///  (the loss returned stays unscaled).
///  A LibTorch module fits by wrapping `module.parameters()` (`.data_ptr<float>()`, `.numel()`)
///  and calling `ready(i)` from a gradient hook on tensor i; see docs/concepts/model.md.
///  A minimal model: tests/archetypes/archetypes.hpp `model_archetype`.
template <class M>
concept model = floating_element<typename M::value_type> && requires { typename M::batch_type; } &&
                requires(M& m, const M& cm, std::size_t i, const typename M::batch_type& batch,
                         gradient_ready ready) {
                  { cm.tensor_count() } noexcept -> std::same_as<std::size_t>;
                  { m.parameters(i) } -> std::same_as<std::span<typename M::value_type>>;
                  { m.gradients(i) } -> std::same_as<std::span<typename M::value_type>>;
                  { m.forward_backward(batch, ready) } -> std::convertible_to<double>;
                };

}  // namespace dtrain
