#pragma once
/// @file
/// `allreduce::trainer<Collective, Updater, Model>`: synchronous data-parallel training of a model
/// whose tensors live in host memory. Every rank holds a full replica; each step its gradients
/// are averaged across ranks, bucket by bucket while the backward pass goes on, and every rank
/// applies the same update. It is `basic_trainer` (basic_trainer.hpp: what happens, step by
/// step) with the `host_backend`, or for a model of `bfloat16` or `float16` the `mixed_backend`
/// (mixed precision: float master weights and updater state; an updater of `float`).
///
/// <!-- frame: header_mlp_tcp -->
/// @code
/// using comm_t = dtrain::ring<dtrain::tcp_transport>;
/// dtrain::allreduce::trainer trainer(comm_t(dtrain::tcp_transport::from_environment()),
///                                    dtrain::momentum<float>(0.05, 0.9), model);
/// for (auto& batch : my_shard) trainer.step(batch);
/// @endcode

#include <concepts>
#include <type_traits>
#include <span>

#include "dtrain/allreduce/basic_trainer.hpp"
#include "dtrain/allreduce/host_backend.hpp"
#include "dtrain/allreduce/mixed_backend.hpp"
#include "dtrain/allreduce/trainer_options.hpp"
#include "dtrain/concepts/collective.hpp"
#include "dtrain/concepts/model.hpp"
#include "dtrain/concepts/trainable.hpp"
#include "dtrain/core/reduce_op.hpp"

namespace dtrain::allreduce {

/// The host memory policy for `Model`: its own tensors, or a float master copy of a 16-bit model's.
template <class Model>
using host_backend_for = std::conditional_t<std::floating_point<typename Model::value_type>, host_backend<Model>,
                                            mixed_backend<Model>>;

/// Synchronous data-parallel training of `Model` over `Collective`, updated by `Updater`.
/// @tparam Collective a `collective` of the model's value type (ring<tcp_transport>, communicator<...>)
/// @tparam Updater an `updater` of the model's compute type (sgd, momentum, adam, ...): its
///   value type, `float` for a 16-bit model
/// @tparam Model a `model`; the trainer keeps a reference, so it must outlive the trainer
/// Constructed as `basic_trainer` is (collective, updater, model, options): every rank does.
template <class Collective, class Updater, model Model>
  requires trainable<Collective, Updater, Model>
class trainer : public basic_trainer<host_backend_for<Model>, Collective, Updater, Model> {
 public:
  using basic_trainer<host_backend_for<Model>, Collective, Updater, Model>::basic_trainer;

  /// Sums `values` across ranks, in place, in order with the buckets (see `with_collective`).
  template <class E>
  void sum_across_ranks(std::span<E> values) {
    this->with_collective([values](Collective& c) { c.allreduce(values, reduce_op::sum); });
  }
};

template <class Collective, class Updater, class Model>
trainer(Collective, Updater, Model&, trainer_options = {}) -> trainer<Collective, Updater, Model>;

}  // namespace dtrain::allreduce
