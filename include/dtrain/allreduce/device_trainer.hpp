#pragma once
/// @file
/// `allreduce::device_trainer<Collective, Updater, Model>`: the allreduce trainer for models whose
/// parameters and gradients live where Thrust's device system runs: GPU memory in a CUDA build
/// (NCCL, or device buffers staged over TCP), host memory under Thrust's CPP and OMP systems
/// (the same code, tested on machines without a GPU). It is `basic_trainer` with the
/// `thrust_backend` (thrust_backend.hpp: streams and events; docs/gpu.md has the timeline).
/// Link `dtrain::thrust` (and `dtrain::cuda` in a CUDA build, compiled by nvcc).
///
/// <!-- frame: header_device_trainer -->
/// @code
/// // comm: a nccl_communicator, or a staged_communicator<tcp_transport>
/// dtrain::allreduce::device_trainer trainer(std::move(comm), dtrain::momentum<float>(0.05, 0.9), model);
/// for (auto& batch : my_shard) trainer.step(batch);
/// @endcode
///
/// What `trainer` offers (bucket plan, checks across ranks, local SGD, lr schedules, stats) works
/// the same, 16-bit compression and checkpoints (through host copies) included; top-k,
/// accumulation, unused parameters and clipping are host-only so far and refused with `unsupported`.

#include <concepts>

#include "dtrain/allreduce/basic_trainer.hpp"
#include "dtrain/allreduce/thrust_backend.hpp"
#include "dtrain/allreduce/trainer_options.hpp"
#include "dtrain/concepts/trainable.hpp"
#include "dtrain/reduce/thrust.hpp"

namespace dtrain::allreduce {

/// Synchronous data-parallel training of a `device_model` over a collective of device buffers.
/// @tparam Collective a collective whose memory space is Thrust's device memory
///   (`nccl_communicator`, `staged_communicator<tcp_transport>`)
/// @tparam Updater a host updater type (sgd, momentum, adam, ...); its rule runs on the device
/// @tparam Model a `device_model`; the trainer keeps a reference
/// Constructed as `basic_trainer` is (collective, updater, model, options): every rank does.
template <class Collective, class Updater, device_model Model>
  requires trainable<Collective, Updater, Model> && std::floating_point<typename Model::value_type> &&
           std::same_as<typename Collective::memory_space, thrust_device_memory>
class device_trainer : public basic_trainer<thrust_backend<Model>, Collective, Updater, Model> {
 public:
  using basic_trainer<thrust_backend<Model>, Collective, Updater, Model>::basic_trainer;
};

template <class Collective, class Updater, class Model>
device_trainer(Collective, Updater, Model&, trainer_options = {}) -> device_trainer<Collective, Updater, Model>;

}  // namespace dtrain::allreduce
