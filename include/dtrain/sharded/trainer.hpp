#pragma once
/// @file
/// `sharded::trainer<Collective, Stage, Updater, Model>`: synchronous data parallelism whose
/// optimizer state (ZeRO stage 1) and gradients (stage 2) are sharded across the ranks instead
/// of replicated (Rajbhandari et al., SC'20; PyTorch's ZeroRedundancyOptimizer and FSDP's
/// SHARD_GRAD_OP). It takes the allreduce trainer's parts: any `collective`, any `updater`,
/// any `model`, unchanged.
///
/// Each step (layout.hpp says which slice a rank owns):
///  - forward and backward; as each bucket's gradients are final (plan order, as the allreduce
///    trainer launches them) the communication thread packs the bucket and averages it:
///    stage 1 allreduces it and writes the average back into the model's gradients (every
///    rank sees the full averaged gradient, as after DDP); stage 2 reduce-scatters it, so each
///    rank receives only the average of its own slice, with half of an allreduce's traffic, and
///    the model's gradients stay this rank's own;
///  - the updater steps this rank's master slice of the parameters with its slice of the
///    averaged gradient: its state covers 1/P of the parameters;
///  - each bucket's updated slices are allgathered into every rank's model.
/// The result equals the allreduce trainer's (the same averaged gradient, the same update), and
/// the replicas stay bit-identical, since every rank receives the same allgathered bits. With a
/// `Replicas` collective (hybrid sharding), each slice's average is averaged again across the
/// replica group before the update.
///
/// Mixed precision: a model of `bfloat16` or `float16` computes in 16 bits; the master slice,
/// the averaged gradient's slice and the updater's state are `float` (`master_type`), gathers
/// travel in 16 bits, and gradients are averaged in `options.reduce_in`'s precision. With
/// `options.scaling` the loss is scaled and a step whose gradients overflowed is skipped on
/// every rank (updater/loss_scaler.hpp); stage 1 then leaves the scaled average in the model.
///
/// <!-- frame: header_mlp_tcp -->
/// @code
/// using comm_t = dtrain::ring<dtrain::tcp_transport>;
/// dtrain::sharded::trainer<comm_t, dtrain::sharded::zero2, dtrain::adam<float>, my_model> trainer(
///     comm_t(dtrain::tcp_transport::from_environment()), dtrain::adam<float>(1e-3), model);
/// for (auto& batch : my_shard) trainer.step(batch);
/// @endcode


#include "dtrain/concepts/model.hpp"
#include "dtrain/concepts/trainable.hpp"
#include "dtrain/sharded/basic_trainer.hpp"
#include "dtrain/sharded/host_backend.hpp"
#include "dtrain/sharded/options.hpp"

namespace dtrain::sharded {

/// Stages 1 and 2 on host memory: `basic_trainer` with the `host_backend`.
/// Constructed with (collective, updater, model, options), or (collective, replicas, updater,
/// model, options) for hybrid sharding: every rank does.
template <class Collective, sharding_stage Stage, class Updater, model Model, class Replicas>
  requires(Stage::stage <= 2 && trainable<Collective, Updater, Model> &&
           (!detail::has_replicas<Replicas> || trainable<Replicas, Updater, Model>))
class trainer<Collective, Stage, Updater, Model, Replicas>
    : public basic_trainer<host_backend<Model>, Collective, Stage, Updater, Model, Replicas> {
 public:
  using basic_trainer<host_backend<Model>, Collective, Stage, Updater, Model, Replicas>::basic_trainer;
};

}  // namespace dtrain::sharded
