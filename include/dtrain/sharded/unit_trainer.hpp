#pragma once
/// @file
/// `sharded::trainer<Collective, zero3, Updater, Model>`: ZeRO stage 3 (FSDP's FULL_SHARD) on host
/// memory, for a `unit_model`: `basic_unit_trainer` (basic_unit_trainer.hpp says what a step does)
/// with the `host_backend`. No rank holds the whole model: each unit's parameters are gathered
/// just before it runs and freed right after.

#include "dtrain/concepts/trainable.hpp"
#include "dtrain/concepts/unit_model.hpp"
#include "dtrain/sharded/basic_unit_trainer.hpp"
#include "dtrain/sharded/host_backend.hpp"
#include "dtrain/sharded/options.hpp"

namespace dtrain::sharded {

template <class Collective, class Updater, unit_model Model, class Replicas>
  requires(trainable<Collective, Updater, Model> &&
           (!detail::has_replicas<Replicas> || trainable<Replicas, Updater, Model>))
class trainer<Collective, zero3, Updater, Model, Replicas> final
    : public basic_unit_trainer<host_backend<Model>, Collective, Updater, Model, Replicas> {
 public:
  using basic_unit_trainer<host_backend<Model>, Collective, Updater, Model, Replicas>::basic_unit_trainer;
};

}  // namespace dtrain::sharded
