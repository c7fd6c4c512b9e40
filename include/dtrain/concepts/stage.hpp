#pragma once
/// @file
/// The `stage` concept: one contiguous slice of a model's layers, as a pipeline runs it. Where a
/// `model` runs forward and backward on a whole batch, a stage runs them on one micro-batch's
/// activations and keeps what its backward pass needs, per micro-batch, in between.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

#include "dtrain/core/memory_space.hpp"

namespace dtrain {

/// Which micro-batch a stage is asked to run: the trainer step it belongs to, its index within
/// the step and how many the step has. The first stage picks its input samples by it, the last
/// its targets; the stages between need only `index` to key what they keep for backward.
struct micro_batch {
  std::uint64_t step = 0;
  int index = 0;
  int count = 1;
};

/// It has parameter and gradient tensors in memory `Space`, as a `model` has.
template <class S, class Space = host_memory>
concept tensor_owner = std::floating_point<typename S::value_type> &&
                       requires(S& s, const S& cs, std::size_t i) {
                         { cs.tensor_count() } noexcept -> std::same_as<std::size_t>;
                         { s.parameters(i) } -> std::same_as<span_in<Space, typename S::value_type>>;
                         { s.gradients(i) } -> std::same_as<span_in<Space, typename S::value_type>>;
                       };

/// It says how many elements one micro-batch's activation has on each side of it.
template <class S>
concept activation_shaped = requires(const S& cs) {
  { cs.input_size() } noexcept -> std::same_as<std::size_t>;
  { cs.output_size() } noexcept -> std::same_as<std::size_t>;
};

/// It runs forward and backward on one micro-batch, activations in memory `Space`, and can drop
/// what it kept.
template <class S, class Space = host_memory>
concept micro_batch_runner =
    requires(S& s, const micro_batch& mb, span_in<Space, const typename S::value_type> in,
             span_in<Space, typename S::value_type> out) {
      { s.forward(mb, in, out) } -> std::convertible_to<double>;
      { s.backward(mb, in, out) } -> std::same_as<void>;
      { s.discard(mb) } -> std::same_as<void>;
    };

/// A stage of a pipeline-parallel model.
///  1. `S::value_type` is the floating-point type of parameters, gradients and activations.
///  2. `s.tensor_count()`, `s.parameters(i)`, `s.gradients(i)`: as the `model` concept's (sizes
///     and addresses fixed for the stage's lifetime).
///  3. `s.input_size()` / `s.output_size()`: elements of one micro-batch's input and output
///     activation; 0 on the first stage (it reads its own samples) and the last (it ends in the
///     loss). Fixed for the stage's lifetime.
///  4. `s.forward(mb, input, output)` runs micro-batch `mb` forward from `input` (input_size
///     elements) into `output` (output_size elements) and keeps what its backward needs, keyed by
///     `mb.index`. It returns the micro-batch's mean loss on the last stage, 0 elsewhere.
///  5. `s.backward(mb, output_grad, input_grad)` takes the gradient of the loss with respect to
///     `mb`'s output (empty on the last stage, which starts from its own loss) and writes the
///     gradient with respect to its input into `input_grad` (empty on the first stage). It *adds*
///     the micro-batch's parameter gradients to `gradients(i)` and drops what `forward` kept.
///  6. `s.discard(mb)` drops what `forward` kept for `mb` without a backward pass (the executor's
///     re-materialisation runs forward again before backward).
///  Semantics: the trainer zeroes the gradients before a step and scales them after it, so the
///  loss a stage differentiates is one micro-batch's mean loss. `forward` and `backward` must
///  not change `parameters(i)`; they may be called for several micro-batches in any interleaving
///  (a schedule's order), but each micro-batch's forward comes before its backward. Deterministic:
///  the same inputs and parameters give the same bits. One thread at a time.
///  On a device (`Space` = `device_memory`) parameters, gradients and activations are
///  `device_span`s; the executor copies activations between stages on the stream its
///  point-to-point communicator orders after the legacy default stream, so a stage's kernels
///  run there, or have finished when `forward` and `backward` return.
///  A minimal model: tests/archetypes/archetypes.hpp `stage_archetype`.
template <class S, class Space = host_memory>
concept stage = tensor_owner<S, Space> && activation_shaped<S> && micro_batch_runner<S, Space>;

}  // namespace dtrain
