#pragma once
/// @file
/// The `unit_model` concept: a model that runs unit by unit (a layer, or a group of layers) and
/// holds none of its parameters itself, so a sharded trainer (ZeRO stage 3, FSDP) can gather
/// each unit's parameters just before it runs and free them right after.

#include <concepts>
#include <cstddef>
#include <span>
#include <vector>

#include "dtrain/concepts/floating_element.hpp"

namespace dtrain {

/// What a stage-3 trainer gives a unit model's pass: each unit's parameters, gathered on
/// demand, and buffers for its gradients. Calls come from the thread that runs
/// `forward_backward`. The spans are host memory's; a device unit model's
/// (device_unit_model.hpp) are its memory's (`ConstSpan`, `Span`).
template <class T, class ConstSpan = std::span<const T>, class Span = std::span<T>>
class unit_access {
 public:
  /// Unit `u`'s tensor `k`, gathered (the call waits for it, and may start gathering the next
  /// unit). Valid until `forward_done(u)` or `backward_done(u)`.
  virtual ConstSpan parameters(std::size_t u, std::size_t k) = 0;
  /// Where the backward pass writes unit `u`'s tensor `k`'s gradient (it overwrites it).
  virtual Span gradients(std::size_t u, std::size_t k) = 0;
  /// The forward pass is done with unit `u`: its parameters are freed (gathered again for backward).
  virtual void forward_done(std::size_t u) = 0;
  /// Unit `u`'s gradients are final: they are averaged across ranks and freed, with its parameters.
  virtual void backward_done(std::size_t u) = 0;

 protected:
  ~unit_access() = default;
};

/// A model trained with its parameters sharded (ZeRO stage 3).
///  1. `M::value_type` is the type of parameters and gradients, a `floating_element` (16-bit:
///     mixed precision); `M::batch_type` whatever one `forward_backward` consumes.
///  2. `m.unit_count()`: the number of units; noexcept, fixed.
///  3. `m.unit_tensors(u)`: the sizes of unit u's tensors; fixed.
///  4. `m.initialize(u, k, w)`: fills `w` with tensor k of unit u's initial parameters, in the
///     master precision (`compute_type_t<value_type>`: `float` for a 16-bit model) (the
///     trainer calls it on its root rank, one unit at a time, and shards the result).
///  5. `m.forward_backward(batch, units)`: the forward pass, then the backward pass, on `batch`,
///     reading parameters only through `units.parameters(u, k)` and writing the mean gradient of
///     the batch's loss into `units.gradients(u, k)`; returns the mean loss. It calls
///     `forward_done(u)` after unit u's forward and `backward_done(u)` once u's gradients are
///     final, exactly once each per unit.
///  Optional, as for `model`: `m.set_loss_scale(s)`, when the trainer scales the loss.
///  Semantics: every rank visits the units in the same order (the trainer's gathers and
///  reductions follow it, and ranks must issue the same collectives); a unit's parameters are
///  not read after its `forward_done` until asked for again. The allreduce trainer's `model`
///  concept is the one-unit case of this with the parameters held by the model.
template <class M>
concept unit_model =
    floating_element<typename M::value_type> && requires { typename M::batch_type; } &&
    requires(M& m, const M& cm, std::size_t u, std::span<compute_type_t<typename M::value_type>> w,
             const typename M::batch_type& batch, unit_access<typename M::value_type>& units) {
      { cm.unit_count() } noexcept -> std::same_as<std::size_t>;
      { cm.unit_tensors(u) } -> std::convertible_to<std::vector<std::size_t>>;
      { m.initialize(u, u, w) } -> std::same_as<void>;
      { m.forward_backward(batch, units) } -> std::convertible_to<double>;
    };

}  // namespace dtrain
