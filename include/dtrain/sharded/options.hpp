#pragma once
/// @file
/// What every stage of `sharded::trainer` shares: the stages as policies, the options, what a
/// step returns and what the trainer reports of its memory. `trainer<Collective, Stage, ...>` itself is
/// trainer.hpp (stages 1 and 2) and unit_trainer.hpp (stage 3).

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "dtrain/core/error.hpp"
#include "dtrain/core/memory_use.hpp"
#include "dtrain/updater/loss_scaler.hpp"

namespace dtrain::sharded {

/// ZeRO stage 1: the optimizer state is sharded; gradients are allreduced in full.
struct zero1 {
  static constexpr int stage = 1;
  static constexpr std::string_view name = "zero1";
};
/// ZeRO stage 2: the optimizer state and the averaged gradients are sharded; gradients are
/// reduce-scattered.
struct zero2 {
  static constexpr int stage = 2;
  static constexpr std::string_view name = "zero2";
};
/// ZeRO stage 3 (FSDP's FULL_SHARD): the parameters are sharded too, and gathered unit by unit
/// around each unit's forward and backward (a `unit_model`).
struct zero3 {
  static constexpr int stage = 3;
  static constexpr std::string_view name = "zero3";
};

/// A sharding stage: `zero1`, `zero2` or `zero3`.
template <class S>
concept sharding_stage = std::same_as<S, zero1> || std::same_as<S, zero2> || std::same_as<S, zero3>;

using dtrain::reduce_precision;

struct trainer_options {
  std::size_t first_bucket_bytes = std::size_t{1} << 20;  ///< stages 1, 2: as DDP's, so overlap starts early
  std::size_t bucket_bytes = std::size_t{25} << 20;       ///< stages 1, 2: the other buckets' capacity
  int root = 0;                                            ///< the rank whose parameters every rank starts from
  /// Stage 3: the most units whose parameters may be gathered at once, the one running
  /// included (FSDP's `limit_all_gathers`); at least 1. With 2, the next unit is gathered
  /// while the current one computes.
  std::size_t limit_all_gathers = 2;
  /// The learning rate of step k (0-based); empty: the updater's own rate throughout.
  std::function<double(std::size_t step)> learning_rate;
  /// Where gradients are averaged, for a 16-bit model (mixed precision).
  reduce_precision reduce_in = reduce_precision::master;
  /// Dynamic loss scaling (float16 models); the model must have `set_loss_scale(double)`.
  loss_scaling scaling;
};

/// Bytes the trainer itself holds on this rank (core/memory_use.hpp). At stages 1 and 2 the
/// model's own tensors are the model's, full size, and `parameters`, `gradients` and
/// `optimizer_state` are this rank's slices; at stage 3 the model holds no parameters: `gathered`
/// counts the units' parameters while they are gathered, `unit_gradients` their gradients until
/// reduced.
using dtrain::memory_use;

struct step_result {
  double loss = 0;           ///< this rank's batch's mean loss (unscaled)
  double learning_rate = 0;  ///< the rate the step used
  double loss_scale = 1;     ///< the factor the step's loss was scaled by (1 without loss scaling)
  bool skipped = false;      ///< a gradient was inf or NaN on some rank: no parameter changed
};

/// No replica groups: the sharded trainer's group is the whole job.
struct no_replicas {};

/// Sharded data parallelism at `Stage` of `Model`, sharded over `Collective`'s group and, when
/// `Replicas` is a collective, replicated across its group (hybrid sharding: FSDP's
/// HYBRID_SHARD, shard within a host and replicate across hosts), updated by `Updater`.
template <class Collective, sharding_stage Stage, class Updater, class Model, class Replicas = no_replicas>
class trainer;

namespace detail {
template <class Replicas>
inline constexpr bool has_replicas = !std::same_as<Replicas, no_replicas>;
}  // namespace detail

}  // namespace dtrain::sharded
