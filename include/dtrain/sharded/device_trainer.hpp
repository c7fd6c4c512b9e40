#pragma once
/// @file
/// `sharded::device_trainer<Collective, Stage, Updater, Model>`: ZeRO stages 1 and 2 for models
/// whose parameters and gradients live where Thrust's device system runs: GPU memory in a CUDA
/// build (NCCL, or device buffers staged over TCP), host memory under Thrust's CPP and OMP
/// systems (the same code, tested on machines without a GPU). It is `basic_trainer` with the
/// `thrust_backend` (thrust_backend.hpp: streams and events); what a step does is trainer.hpp's.
/// Link `dtrain::thrust` (and `dtrain::cuda` in a CUDA build, compiled by nvcc).
///
/// <!-- frame: header_device_trainer -->
/// @code
/// // comm: a nccl_communicator, or a staged_communicator<tcp_transport>; model: a device_model
/// dtrain::sharded::device_trainer<comm_t, dtrain::sharded::zero2, dtrain::adam<float>, my_model> trainer(
///     std::move(comm), dtrain::adam<float>(1e-3), model);
/// for (auto& batch : my_shard) trainer.step(batch);
/// @endcode
///
/// The master slice, the averaged gradient's slice and the optimizer state are device memory, 1/P
/// of the model's each (`memory().device`). Hybrid sharding, mixed precision (a `bfloat16` or
/// `float16` device model with `float` master, gradient and state) and dynamic loss scaling work
/// as on the host; checkpoints go through host copies of the slices (the host trainer's set, which
/// loads on either memory). Stage 3 takes a `device_unit_model` (basic_unit_trainer.hpp says what
/// a step does; a unit's buffers are freed once its kernels are done).

#include <concepts>

#include "dtrain/allreduce/thrust_backend.hpp"
#include "dtrain/concepts/trainable.hpp"
#include "dtrain/cuda/thrust_space.hpp"
#include "dtrain/sharded/basic_trainer.hpp"
#include "dtrain/sharded/basic_unit_trainer.hpp"
#include "dtrain/sharded/options.hpp"
#include "dtrain/sharded/thrust_backend.hpp"

namespace dtrain::sharded {

/// ZeRO on Thrust's device memory: stages 1 and 2 of a `device_model`, stage 3 of a
/// `device_unit_model`, over a collective of device buffers.
/// @tparam Collective a collective whose memory space is Thrust's device memory
///   (`nccl_communicator`, `staged_communicator<tcp_transport>`); `Replicas` too, for hybrid
///   sharding
/// @tparam Updater a host updater type (sgd, momentum, adam, ...); its rule runs on the device
/// @tparam Model `float`, `double`, or 16-bit (mixed precision); the trainer keeps a reference
template <class Collective, sharding_stage Stage, class Updater, class Model, class Replicas = no_replicas>
class device_trainer;

template <class Collective, sharding_stage Stage, class Updater, device_model Model, class Replicas>
  requires(Stage::stage <= 2 && trainable<Collective, Updater, Model> &&
           std::same_as<typename Collective::memory_space, thrust_device_memory> &&
           (!detail::has_replicas<Replicas> || trainable<Replicas, Updater, Model>))
class device_trainer<Collective, Stage, Updater, Model, Replicas>
    : public basic_trainer<thrust_backend<Model>, Collective, Stage, Updater, Model, Replicas> {
 public:
  using basic_trainer<thrust_backend<Model>, Collective, Stage, Updater, Model, Replicas>::basic_trainer;
};

template <class Collective, class Updater, device_unit_model Model, class Replicas>
  requires(trainable<Collective, Updater, Model> &&
           std::same_as<typename Collective::memory_space, thrust_device_memory> &&
           (!detail::has_replicas<Replicas> || trainable<Replicas, Updater, Model>))
class device_trainer<Collective, zero3, Updater, Model, Replicas>
    : public basic_unit_trainer<thrust_backend<Model>, Collective, Updater, Model, Replicas> {
 public:
  using basic_unit_trainer<thrust_backend<Model>, Collective, Updater, Model, Replicas>::basic_unit_trainer;
};

}  // namespace dtrain::sharded
