#pragma once
/// @file
/// `pipeline::trainer<Transport, Schedule, Updater, Stage, Replicas>`: pipeline-parallel training.
/// This rank runs its chunks (stages) of the model under `Schedule` over `Transport`, the pipeline
/// group; with `Replicas` (a collective over the data-parallel group), several such pipelines
/// train on different micro-batches and average their gradients before each update: data x
/// pipeline parallelism, and with tensor-parallel stages, the three together.
///
/// @code
/// dtrain::device_mesh mesh(dtrain::process_group(std::move(world)), {{"dp", 2}, {"pp", 2}});
/// dtrain::ring<group> replicas(mesh.group("dp"));
/// dtrain::pipeline::trainer<group, dtrain::pipeline::one_f_one_b, dtrain::adam<double>, my_stage,
///                           dtrain::ring<group>>
///     t(mesh.group("pp"), {my_stage(mesh.coordinate("pp"))}, dtrain::adam<double>(1e-3), {}, {}, replicas);
/// for (int i = 0; i < steps; ++i) t.step();
/// @endcode
///
/// A flushed schedule's step equals serial mini-batch training with gradient accumulation over
/// the same micro-batches: every stage adds its micro-batches' gradients in micro-batch order,
/// the trainer scales them by 1/m, averages them over the replicas, and updates once.
/// `pipedream` updates after every micro-batch instead, with weight stashing.

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtrain/concepts/stage.hpp"
#include "dtrain/concepts/transport.hpp"
#include "dtrain/concepts/updater.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/reduce_op.hpp"
#include "dtrain/pipeline/executor.hpp"
#include "dtrain/pipeline/schedule.hpp"

namespace dtrain::pipeline {

/// The `Replicas` of a trainer with no data parallelism: one replica, nothing to average.
struct single_replica {
  int size() const noexcept { return 1; }
  template <class T>
  void allreduce(std::span<T>, reduce_op) {}
};

/// A data-parallel group the trainer can average gradients over: a size and an allreduce.
template <class R, class T>
concept replica_group = requires(R& r, std::span<T> values) {
  { r.size() } -> std::convertible_to<int>;
  r.allreduce(values, reduce_op::avg);
};

/// How a pipeline trainer runs.
struct trainer_options {
  /// Micro-batches per step (m).
  int micro_batches = 4;
  /// The executor's deadline, tags and lookahead (`rematerialise` and `stash_weights` are set
  /// from the schedule).
  executor_options executor{};
  /// The learning rate for each step (or, under `pipedream`, each micro-batch update); empty
  /// leaves the updater's own.
  std::function<double(std::uint64_t update)> learning_rate;
};

/// What one `step` did on this rank.
struct step_result {
  /// The step's mean micro-batch loss, on the rank holding the last stage (`has_loss`).
  double loss = 0;
  bool has_loss = false;
  /// The executor's account of the step: compute and wall seconds, peak live micro-batches.
  step_report report{};
  /// Seconds spent averaging gradients over the replicas.
  double replica_seconds = 0;
};

/// Trains this rank's chunks of a pipeline-parallel model.
template <transport Transport, class Schedule, class Updater, stage Stage, class Replicas = single_replica>
  requires updater<Updater, typename Stage::value_type> && replica_group<Replicas, typename Stage::value_type>
class trainer {
 public:
  using value_type = typename Stage::value_type;

  /// @param pipeline the pipeline group: rank r runs stages r, r + p, ... (one per chunk).
  /// @param chunks this rank's stages, `schedule.chunks()` of them, chunk c being stage c p + r.
  /// @param replicas the data-parallel group of this rank's pipeline position (held by reference:
  ///   it outlives the trainer); `single_replica` for none.
  /// @throws dtrain::error `invalid_argument` for the wrong number of chunks or micro-batches.
  trainer(Transport pipeline, std::vector<Stage> chunks, Updater updater, Schedule schedule = {},
          trainer_options options = {}, Replicas replicas = {})
    requires(!std::is_reference_v<Replicas>)
      : pipeline_(std::move(pipeline)), chunks_(std::move(chunks)), updater_(std::move(updater)),
        schedule_(std::move(schedule)), options_(std::move(options)), replicas_(std::move(replicas)),
        executor_(pipeline_, std::span(chunks_), executor_options_for(options_, schedule_)) {
    if (static_cast<int>(chunks_.size()) != schedule_.chunks()) {
      throw error(errc::invalid_argument, "pipeline::trainer: " + std::string(Schedule::name) + " runs " +
                                              std::to_string(schedule_.chunks()) + " chunks per rank, given " +
                                              std::to_string(chunks_.size()));
    }
    if (options_.micro_batches < 1) throw error(errc::invalid_argument, "pipeline::trainer: micro_batches must be >= 1");
    std::size_t n = 0;
    for (Stage& s : chunks_) {
      for (std::size_t i = 0; i < s.tensor_count(); ++i) n += s.parameters(i).size();
    }
    updater_.resize(n);
    zero_gradients();
    shape_ = pipeline_shape{pipeline_.size(), schedule_.chunks(), options_.micro_batches};
    actions_ = schedule_.actions(pipeline_.rank(), shape_);
  }

  /// Runs one step: the schedule's actions on every micro-batch, then (flushed schedules) one
  /// update from the mean gradient, averaged over the replicas.
  step_result step() {
    step_result result;
    result.report = executor_.run(actions_, shape_, step_, [&](int mb) { optimizer_step(mb, result); });
    result.has_loss = result.report.has_loss;
    result.loss = result.report.loss_sum / shape_.micro_batches;
    ++step_;
    return result;
  }

  /// Steps run so far; updates applied so far (one per step, or one per micro-batch under pipedream).
  std::uint64_t steps() const noexcept { return step_; }
  std::uint64_t updates() const noexcept { return updates_; }
  std::span<Stage> chunks() noexcept { return chunks_; }
  Updater& updater() noexcept { return updater_; }
  const pipeline_shape& shape() const noexcept { return shape_; }
  const std::vector<action>& actions() const noexcept { return actions_; }
  Transport& pipeline() noexcept { return pipeline_; }

 private:
  static constexpr bool per_micro_batch = std::is_same_v<Schedule, pipedream>;

  static executor_options executor_options_for(const trainer_options& o, const Schedule& s) {
    executor_options e = o.executor;
    if constexpr (std::is_same_v<Schedule, gpipe>) e.rematerialise = s.rematerialise;
    e.stash_weights = per_micro_batch;
    return e;
  }

  void zero_gradients() {
    for (Stage& s : chunks_) {
      for (std::size_t i = 0; i < s.tensor_count(); ++i) {
        for (value_type& g : s.gradients(i)) g = value_type(0);
      }
    }
  }

  template <class F>
  void for_each_tensor(F&& f) {
    std::size_t offset = 0;
    for (Stage& s : chunks_) {
      for (std::size_t i = 0; i < s.tensor_count(); ++i) {
        f(s.parameters(i), s.gradients(i), offset);
        offset += s.parameters(i).size();
      }
    }
  }

  // A flushed schedule: the mean over m micro-batches, averaged over replicas, one update.
  // PipeDream: each micro-batch's gradient is its own update (replicas average it too).
  void optimizer_step(int, step_result& result) {
    if (!per_micro_batch) {
      const value_type scale = value_type(1) / static_cast<value_type>(shape_.micro_batches);
      for_each_tensor([&](auto, std::span<value_type> g, std::size_t) {
        for (value_type& x : g) x *= scale;
      });
    }
    if (replicas_.size() > 1) average_over_replicas(result);
    if (options_.learning_rate) updater_.set_learning_rate(options_.learning_rate(updates_));
    for_each_tensor([&](std::span<value_type> p, std::span<value_type> g, std::size_t offset) {
      updater_.step(p, std::span<const value_type>(g), offset, step_info{});
    });
    zero_gradients();
    ++updates_;
  }

  void average_over_replicas(step_result& result) {
    const auto start = std::chrono::steady_clock::now();
    flat_.clear();
    for_each_tensor([&](auto, std::span<value_type> g, std::size_t) { flat_.insert(flat_.end(), g.begin(), g.end()); });
    replicas_.allreduce(std::span(flat_), reduce_op::avg);
    auto at = flat_.begin();
    for_each_tensor([&](auto, std::span<value_type> g, std::size_t) {
      std::copy(at, at + static_cast<std::ptrdiff_t>(g.size()), g.begin());
      at += static_cast<std::ptrdiff_t>(g.size());
    });
    result.replica_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  Transport pipeline_;
  std::vector<Stage> chunks_;
  Updater updater_;
  Schedule schedule_;
  trainer_options options_;
  Replicas replicas_;
  executor<Transport, Stage> executor_;
  pipeline_shape shape_{};
  std::vector<action> actions_;
  std::vector<value_type> flat_;
  std::uint64_t step_ = 0;
  std::uint64_t updates_ = 0;
};

}  // namespace dtrain::pipeline
