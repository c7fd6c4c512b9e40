#pragma once
/// @file
/// `pipeline::trainer<Transport, Schedule, Updater, Stage, Replicas>`: pipeline-parallel training.
/// This rank runs its chunks (stages) of the model under `Schedule` over `Transport`, the pipeline
/// group; with `Replicas` (a collective over the data-parallel group), several such pipelines
/// train on different micro-batches and average their gradients before each update: data x
/// pipeline parallelism, and with tensor-parallel stages, the three together.
///
/// <!-- frame: header_pipeline_stage -->
/// @code
/// using group = dtrain::process_group<dtrain::tcp_transport>;
/// dtrain::device_mesh mesh(group(dtrain::tcp_transport::from_environment()), {{"dp", 2}, {"pp", 2}});
/// // The stage is told its replica (`dp`): micro_batch carries no replica index.
/// dtrain::pipeline::trainer<group, dtrain::pipeline::one_f_one_b, dtrain::adam<double>, my_stage,
///                           dtrain::ring<group>>
///     t(mesh.group("pp"), {my_stage(mesh.coordinate("pp"), mesh.coordinate("dp"))}, dtrain::adam<double>(1e-3),
///       {}, {}, dtrain::ring<group>(mesh.group("dp")));  // the collective is moved in: not copyable
/// for (int i = 0; i < steps; ++i) t.step();
/// @endcode
///
/// A flushed schedule's step equals serial mini-batch training with gradient accumulation over
/// the same micro-batches: every stage adds its micro-batches' gradients in micro-batch order,
/// the trainer multiplies the sum by 1/m (a serial loop that divides by m instead can differ in
/// the last bit), averages it over the replicas, and updates once. `pipedream` updates after
/// every micro-batch instead, with weight stashing. `micro_batch` says which micro-batch of which
/// step, not which replica: a stage that picks its samples must know its `dp` coordinate, or
/// every replica trains on the same data. The loss a step reports is this replica's.

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtrain/allreduce/bucket_plan.hpp"
#include "dtrain/concepts/stage.hpp"
#include "dtrain/concepts/transport.hpp"
#include "dtrain/concepts/updater.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/memory_space.hpp"
#include "dtrain/core/reduce_op.hpp"
#include "dtrain/core/trace.hpp"
#include "dtrain/detail/comm_thread.hpp"
#include "dtrain/pipeline/checkpoint.hpp"
#include "dtrain/pipeline/executor.hpp"
#include "dtrain/pipeline/schedule.hpp"

namespace dtrain::pipeline {

/// The `Replicas` of a trainer with no data parallelism: one replica, nothing to average.
struct single_replica {
  int size() const noexcept { return 1; }
  template <class Span>
  void allreduce(Span, reduce_op) {}
};

/// A data-parallel group the trainer can average gradients over: a size and an allreduce of
/// `Span`s (`std::span`, or `device_span` for a trainer on device memory).
template <class R, class Span>
concept replica_group = requires(R& r, Span values) {
  { r.size() } -> std::convertible_to<int>;
  r.allreduce(values, reduce_op::avg);
};

/// An updater of parameters in memory `Space`: a host `updater`, or `device_updater<U>` (its
/// spans are Thrust's device buffers) for a trainer on device memory.
template <class U, class T, class Space>
concept updater_in = requires(U& u, span_in<Space, T> params, span_in<Space, const T> grads, std::size_t n,
                              step_info info, double lr) {
  { U::name } -> std::convertible_to<std::string_view>;
  { U::state_slots } -> std::convertible_to<std::size_t>;
  u.resize(n);
  u.step(params, grads, n, info);
  { u.state() } -> std::convertible_to<span_in<Space, T>>;
  u.set_learning_rate(lr);
};

/// How a pipeline trainer runs.
struct trainer_options {
  /// Micro-batches per step (m).
  int micro_batches = 4;
  /// The executor's deadline, tags and lookahead (`rematerialise` and `stash_weights` are set
  /// from the schedule).
  executor_options executor{};
  /// The learning rate for each step (under `pipedream`, each micro-batch update counts as one), as
  /// the other trainers' `learning_rate(step)`; empty
  /// leaves the updater's own.
  std::function<double(std::size_t step)> learning_rate;
  /// Average a chunk's gradients over the replicas on a communication thread as soon as its last
  /// backward of the step is done, while the pipeline drains (flushed schedules); off averages
  /// everything at the optimizer step.
  bool overlap = true;
  /// A bucket of gradients closes once it holds this many bytes (`allreduce::bucket_plan`, DDP's
  /// bucket: 25 MiB).
  std::size_t bucket_bytes = std::size_t{25} << 20;
};

/// What one `step` did on this rank.
struct step_result {
  /// The step's mean micro-batch loss, on the rank holding the last stage (`has_loss`).
  double loss = 0;
  bool has_loss = false;
  /// The executor's account of the step: compute and wall seconds, peak live micro-batches.
  step_report report{};
  /// Seconds the compute thread waited for the replicas' average (all of it without overlap).
  double replica_wait_seconds = 0;
};

/// Trains this rank's chunks of a pipeline-parallel model: over a host transport, or over a
/// point-to-point communicator of device memory (pipeline/device_link.hpp) with device stages, a
/// `device_updater` and replicas averaging device buffers.
template <class Transport, class Schedule, class Updater, class Stage, class Replicas = single_replica>
  requires stage<Stage, typename Transport::memory_space> &&
           updater_in<Updater, typename Stage::value_type, typename Transport::memory_space> &&
           replica_group<Replicas, typename link<Transport, typename Stage::value_type>::span>
class trainer {
 public:
  using value_type = typename Stage::value_type;

  /// @param pipeline the pipeline group: rank r runs stages r, r + p, ... (one per chunk).
  /// @param chunks this rank's stages, `schedule.chunks()` of them, chunk c being stage c p + r.
  /// @param replicas averages over the data-parallel group of this rank's pipeline position (a
  ///   communicator over a mesh's "dp" axis); `single_replica` for none.
  /// Neighbouring stages then check that they agree on the schedule and on the activations
  /// between them (every rank of the pipeline group constructs its trainer).
  /// @throws dtrain::error `invalid_argument` for the wrong number of chunks or micro-batches, or
  ///   a neighbour with another schedule or partition (both named; the stage that finds it tells
  ///   every rank where the transport can abort the group, and they raise it in their first step).
  trainer(Transport pipeline, std::vector<Stage> chunks, Updater updater, Schedule schedule = {},
          trainer_options options = {}, Replicas replicas = {})
      : pipeline_(std::move(pipeline)), chunks_(std::move(chunks)), updater_(std::move(updater)),
        schedule_(std::move(schedule)), options_(std::move(options)), replicas_(std::move(replicas)),
        executor_(pipeline_, std::span(chunks_), executor_options_for(options_, schedule_)) {
    if (static_cast<int>(chunks_.size()) != schedule_.chunks()) {
      throw error(errc::invalid_argument, "pipeline::trainer: " + std::string(Schedule::name) + " runs " +
                                              std::to_string(schedule_.chunks()) + " chunks per rank, given " +
                                              std::to_string(chunks_.size()));
    }
    if (options_.micro_batches < 1)
      throw error(errc::invalid_argument, "pipeline::trainer: micro_batches must be >= 1");
    std::size_t n = 0;
    for (Stage& s : chunks_) {
      for (std::size_t i = 0; i < s.tensor_count(); ++i) n += s.parameters(i).size();
    }
    updater_.resize(n);
    zero_gradients();
    shape_ = pipeline_shape{pipeline_.size(), schedule_.chunks(), options_.micro_batches};
    actions_ = schedule_.actions(pipeline_.rank(), shape_);
    executor_.handshake(shape_, Schedule::name);
    if (overlapped()) {
      comm_.emplace(trace::recorder::global());
      comm_->post([device = values::current_device()] { values::use_device(device); });  // this thread's device
    }
  }

  trainer(const trainer&) = delete;  // the executor refers to the pipeline group and the chunks
  trainer& operator=(const trainer&) = delete;

  /// Runs one step: the schedule's actions on every micro-batch, then (flushed schedules) one
  /// update from the mean gradient, averaged over the replicas.
  /// @throws dtrain::error from the executor or the replicas' average (a timeout naming the peer,
  ///   a lost peer, a mismatched message); the trainer is then broken: its gradients and
  ///   parameters are part-way through a step, and every later `step` throws `errc::broken`.
  ///   Restore from a checkpoint in a new trainer.
  step_result step() {
    if (broken_)
      throw error(errc::broken, "pipeline::trainer: an earlier step failed; restore a checkpoint in a new trainer");
    step_result result;
    step_hooks hooks;
    hooks.optimizer_step = [&](int) { optimizer_step(result); };
    if (overlapped()) hooks.gradients_final = [&](int chunk) { comm_->post([this, chunk] { average_chunk(chunk); }); };
    try {
      result.report = executor_.run(actions_, shape_, step_, hooks);
    } catch (...) {
      broken_ = true;
      if (comm_) {
        try {
          comm_->drain();  // the averages in flight finish (or fail) before the error leaves
        } catch (...) {
        }
      }
      throw;
    }
    result.has_loss = result.report.has_loss;
    result.loss = result.report.loss_sum / shape_.micro_batches;
    ++step_;
    return result;
  }

  /// Writes this rank's chunks, updater state and position to `path`, atomically. Call between
  /// steps; one replica's files make the job's checkpoint (every replica holds the same).
  void save(const std::string& path) {
    std::vector<std::vector<value_type>> params;
    for (const auto& p : parameter_spans()) params.push_back(values::to_host(const_span(p)));
    const std::vector<value_type> state = values::to_host(const_span(updater_.state()));
    save_pipeline_checkpoint<value_type>(path, identity(), {step_, updates_}, host_spans(params),
                                         std::span<const value_type>(state));
  }

  /// Restores what `save` wrote, so the next `step` continues where that job left off, bit for
  /// bit. @throws dtrain::error `bad_data` naming the file and what does not match this rank
  /// (partition, schedule, rank, updater, micro-batches) or that it is corrupt; nothing is
  /// changed then.
  void load(const std::string& path) {
    const auto spans = parameter_spans();
    std::vector<std::vector<value_type>> params;
    for (const auto& p : spans) params.emplace_back(p.size());
    std::vector<value_type> state(updater_.state().size());
    const checkpoint_position at = load_pipeline_checkpoint<value_type>(path, identity(), host_spans(params), state);
    for (std::size_t i = 0; i < spans.size(); ++i) values::from_host(spans[i], params[i]);
    values::from_host(updater_.state(), state);
    step_ = at.steps;
    updates_ = at.updates;
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
  using values = link<Transport, value_type>;  // the tensors' memory: host or device
  using span = typename values::span;
  using const_span = typename values::const_span;
  static constexpr bool per_micro_batch = std::is_same_v<Schedule, pipedream>;

  static executor_options executor_options_for(const trainer_options& o, const Schedule& s) {
    executor_options e = o.executor;
    if constexpr (std::is_same_v<Schedule, gpipe>) e.rematerialise = s.rematerialise;
    e.stash_weights = per_micro_batch;
    return e;
  }

  checkpoint_identity identity() {
    checkpoint_identity id{std::string(Updater::name),
                           static_cast<std::uint32_t>(Updater::state_slots),
                           static_cast<std::uint32_t>(sizeof(value_type)),
                           std::string(Schedule::name),
                           static_cast<std::uint32_t>(shape_.ranks),
                           static_cast<std::uint32_t>(shape_.chunks),
                           static_cast<std::uint32_t>(shape_.micro_batches),
                           static_cast<std::uint32_t>(pipeline_.rank()),
                           {},
                           {}};
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      id.stages.push_back(shape_.stage_of(pipeline_.rank(), static_cast<int>(c)));
      for (std::size_t i = 0; i < chunks_[c].tensor_count(); ++i) id.sizes.push_back(chunks_[c].parameters(i).size());
    }
    return id;
  }

  static std::vector<std::span<value_type>> host_spans(std::vector<std::vector<value_type>>& v) {
    return {v.begin(), v.end()};
  }

  std::vector<span> parameter_spans() {
    std::vector<span> spans;
    for (Stage& s : chunks_) {
      for (std::size_t i = 0; i < s.tensor_count(); ++i) spans.push_back(s.parameters(i));
    }
    return spans;
  }

  // Replicas averaged on the communication thread while the pipeline drains.
  bool overlapped() const noexcept { return !per_micro_batch && options_.overlap && replicas_.size() > 1; }

  void zero_gradients() {
    for (Stage& s : chunks_) {
      for (std::size_t i = 0; i < s.tensor_count(); ++i) values::zero(s.gradients(i));
    }
  }

  // A flushed schedule updates from the mean over its m micro-batches; PipeDream from each
  // micro-batch's own gradient. Both average over the replicas first.
  void optimizer_step(step_result& result) {
    const auto start = std::chrono::steady_clock::now();
    if (overlapped()) {
      comm_->drain();
    } else {
      for (std::size_t c = 0; c < chunks_.size(); ++c) average_chunk(c);
    }
    result.replica_wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (options_.learning_rate) updater_.set_learning_rate(options_.learning_rate(updates_));
    std::size_t offset = 0;
    for (Stage& s : chunks_) {
      for (std::size_t i = 0; i < s.tensor_count(); ++i) {
        step_info info;
        info.step = updates_ + 1;  // every tensor is updated at every update
        updater_.step(s.parameters(i), const_span(s.gradients(i)), offset, info);
        offset += s.parameters(i).size();
      }
    }
    zero_gradients();
    ++updates_;
  }

  // Scales chunk c's gradients to the micro-batch mean and averages them over the replicas, in
  // the buckets the allreduce trainer would form (`bucket_plan`, the same on every replica; no
  // small first bucket: nothing overlaps here). With one replica the scaling is done in place.
  // (`if constexpr` where a branch is dead for a type: nvcc rejects unreachable code.)
  void average_chunk(std::size_t c) {
    Stage& s = chunks_[c];
    const value_type scale =
        per_micro_batch ? value_type(1) : value_type(1) / static_cast<value_type>(shape_.micro_batches);
    if constexpr (!std::is_same_v<Replicas, single_replica>) {
      if (replicas_.size() > 1) {
        average_buckets(c, scale);
        return;
      }
    }
    scale_in_place(s, scale);
  }

  void scale_in_place(Stage& s, value_type scale) {
    if constexpr (!per_micro_batch) {
      if (scale == value_type(1)) return;
      for (std::size_t i = 0; i < s.tensor_count(); ++i) values::scale(s.gradients(i), scale);
    }
  }

  void average_buckets(std::size_t c, value_type scale) {
    Stage& s = chunks_[c];
    allreduce::bucket_plan& plan = plans_[c];
    if (plan.tensor_count() != s.tensor_count()) {
      std::vector<std::size_t> sizes;
      for (std::size_t i = 0; i < s.tensor_count(); ++i) sizes.push_back(s.gradients(i).size());
      plan = allreduce::bucket_plan(sizes, sizeof(value_type), options_.bucket_bytes, options_.bucket_bytes);
      values::resize(buckets_[c], plan.largest_bucket());
    }
    for (const allreduce::bucket& b : plan.buckets()) {
      const span flat = values::view(buckets_[c]).first(b.elements);
      for (std::size_t k = 0; k < b.tensors.size(); ++k) {
        const span g = s.gradients(b.tensors[k]);
        values::copy(flat.subspan(b.offsets[k], g.size()), const_span(g));
      }
      values::scale(flat, scale);
      replicas_.allreduce(flat, reduce_op::avg);
      for (std::size_t k = 0; k < b.tensors.size(); ++k) {
        const span g = s.gradients(b.tensors[k]);
        values::copy(g, const_span(flat.subspan(b.offsets[k], g.size())));
      }
    }
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
  std::vector<allreduce::bucket_plan> plans_ = std::vector<allreduce::bucket_plan>(chunks_.size());
  std::vector<typename values::buffer> buckets_ = std::vector<typename values::buffer>(chunks_.size());
  std::uint64_t step_ = 0;
  std::uint64_t updates_ = 0;
  bool broken_ = false;
  std::optional<dtrain::detail::comm_thread> comm_;  // last: joined first
};

}  // namespace dtrain::pipeline
