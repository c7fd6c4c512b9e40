#pragma once
/// @file
/// `sharded::basic_trainer<Backend, Collective, Stage, Updater, Model, Replicas>`: stages 1 and 2
/// of sharded data parallelism (trainer.hpp says what a step does), written once for the memory
/// the model's tensors live in: `sharded::trainer` is it on host memory (host_backend.hpp),
/// `sharded::device_trainer` on Thrust's device memory (device_trainer.hpp). The backend says how
/// buckets are packed and copied and how the updater runs; this file says what moves when.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dtrain/allreduce/bucket_plan.hpp"
#include "dtrain/concepts/model.hpp"
#include "dtrain/concepts/trainable.hpp"
#include "dtrain/concepts/updater.hpp"
#include "dtrain/core/element.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/reduce_op.hpp"
#include "dtrain/core/trace.hpp"
#include "dtrain/detail/comm_thread.hpp"
#include "dtrain/sharded/agreement.hpp"
#include "dtrain/sharded/checkpoint.hpp"
#include "dtrain/sharded/layout.hpp"
#include "dtrain/sharded/options.hpp"

namespace dtrain::sharded {

/// Stages 1 and 2 over `Backend`'s memory.
template <class Backend, class Collective, sharding_stage Stage, class Updater, class Model, class Replicas>
  requires(Stage::stage <= 2)
class basic_trainer {
 public:
  using value_type = typename Model::value_type;
  /// The master parameters', the averaged gradient's and the updater's type: `float` for a
  /// 16-bit model, `value_type` otherwise.
  using master_type = typename Backend::master_type;
  using batch_type = typename Model::batch_type;
  /// The updater the trainer steps: `Updater`, or its rule on the device (`device_updater`).
  using updater_type = typename Backend::template updater_for<Updater>;

  /// Broadcasts rank `options.root`'s parameters, checks that every rank planned the same
  /// buckets and stage, and takes this rank's slice. Collective: every rank constructs one.
  /// @throws dtrain::error `invalid_argument` on every rank if the ranks' models, options or
  ///   stages differ, or `root` is not a rank; the collective's errors.
  basic_trainer(Collective comm, Updater updater, Model& model, trainer_options options = {})
    requires(!detail::has_replicas<Replicas>)
      : basic_trainer(std::move(comm), Replicas{}, std::move(updater), model, std::move(options)) {}

  /// Hybrid sharding: sharded over `comm`'s group, replicated across `replicas`' (every rank in
  /// one of each; rank 0 of `replicas` gives every replica its start). Each bucket's slice is
  /// averaged within the group, then across the replicas, and the updates agree bit for bit.
  basic_trainer(Collective comm, Replicas replicas, Updater updater, Model& model, trainer_options options = {})
      : comm_(std::move(comm)),
        replicas_(std::move(replicas)),
        updater_(std::move(updater)),
        model_(model),
        options_(std::move(options)),
        scaler_(options_.scaling) {
    if (options_.root < 0 || options_.root >= comm_.size()) {
      throw error(errc::invalid_argument, name() + ": root " + std::to_string(options_.root) +
                                              " is not a rank of this group of " + std::to_string(comm_.size()));
    }
    dtrain::detail::check_loss_scaling<Model>(scaler_, name());
    const std::vector<std::size_t> sizes = allreduce::detail::tensor_sizes(model_, name());
    plan_ = bucket_plan(sizes, sizeof(value_type), options_.first_bucket_bytes, options_.bucket_bytes);
    layout_ = shard_layout(plan_, comm_.size());
    check_ranks_agree();
    if (!reduces_in_model()) buffer_ = allocate<master_type>(layout_.largest_padded());
    if constexpr (mixed) {
      low_ = allocate<value_type>(layout_.largest_padded());
      const std::size_t largest_slice = layout_.largest_padded() / static_cast<std::size_t>(comm_.size());
      if (Stage::stage == 2 && reduces_in_model()) low_slice_ = allocate<value_type>(largest_slice);
    }
    backend_.settle(model_);  // the model may still be writing its first parameters on its stream
    for (std::size_t b = 0; b < plan_.buckets().size(); ++b) broadcast_parameters(b);
    master_ = allocate<master_type>(layout_.shard_elements());
    gradient_ = allocate<master_type>(layout_.shard_elements());
    for (std::size_t b = 0; b < plan_.buckets().size(); ++b) take_my_slice(b);
    backend_.fence();
    backend_.prepare(updater_, layout_.shard_elements(), model_, plan_.tensor_count());
    readiness_.emplace(plan_);
    peak_ = memory();
    worker_.emplace(trace::recorder::global());
    worker_->post([this] { backend_.bind_thread(); });
  }

  basic_trainer(const basic_trainer&) = delete;
  basic_trainer& operator=(const basic_trainer&) = delete;

  /// One step on this rank's `batch`: forward and backward, gradients averaged into the
  /// shards, this rank's slice updated, the parameters allgathered.
  /// Collective: every rank calls `step` the same number of times.
  /// @throws dtrain::error the collective's errors; `invalid_argument` if the model reported a
  ///   tensor twice, one out of range, or not all. After an error the trainer is broken.
  step_result step(const batch_type& batch) {
    if (broken_) throw error(errc::broken, name() + ": an earlier step failed; rebuild the trainer");
    step_result result;
    if (options_.learning_rate) updater_.set_learning_rate(options_.learning_rate(steps_));
    result.learning_rate = updater_.learning_rate();
    result.loss_scale = scaler_.scale();
    dtrain::detail::set_loss_scale(model_, scaler_);
    readiness_->reset();
    auto on_ready = [&](std::size_t tensor) {
      if (tensor < plan_.tensor_count()) backend_.gradient_final(model_, tensor);
      if (!readiness_->report(tensor)) return;
      while (const bucket* b = readiness_->take_complete()) {
        worker_->post([this, b] { reduce_gradients(index_of(*b)); });
      }
    };
    try {
      result.loss = model_.forward_backward(batch, gradient_ready(on_ready));
      const std::string misuse = readiness_->finish();
      worker_->drain();
      if (!misuse.empty()) throw error(errc::invalid_argument, name() + ": " + misuse);
      while (const bucket* b = readiness_->take_next()) reduce_gradients(index_of(*b));  // the thread is idle
      result.skipped = !backend_.keep_step(comm_, replicas_, scaler_, whole(gradient_));
      if (!result.skipped) {
        backend_.update(updater_, model_, whole(master_), span_of<const master_type>(whole(gradient_)), steps_ + 1);
        for (std::size_t b = 0; b < plan_.buckets().size(); ++b) gather_parameters(b);
        backend_.fence();
        ++steps_;
      }
    } catch (...) {
      broken_ = true;
      try {
        worker_->drain();  // queued buckets reference this step's gradients
      } catch (...) {
      }
      throw;
    }
    return result;
  }

  /// Writes this rank's shard to `<prefix>.shard-<rank>-of-<size>` and, once every rank has,
  /// `<prefix>.manifest` (checkpoint.hpp). Collective, between steps. On the device the slices go
  /// through host copies: the set is the host trainer's and loads on either memory.
  /// @throws dtrain::error the system error where a file cannot be written; `cancelled` on
  ///   the other ranks, naming that rank.
  void save(const std::string& prefix) {
    save_trainer_shards<master_type>(backend_, comm_, replicas_, name(), prefix, identity(),
                                     state_of(steps_, updater_, scaler_), whole(master_), updater_.state());
  }

  /// Restores what `save` wrote, on this or another number of ranks, and gathers the
  /// parameters into the model: the next step continues that job. Collective, between steps.
  /// @throws dtrain::error `bad_data` naming the file and the fault (corrupt, another model,
  ///   updater or bucket size, a shard from another save), on every rank; nothing changes then.
  void load(const std::string& prefix) {
    const shard_state at = load_trainer_shards<master_type>(backend_, comm_, name(), prefix, identity(),
                                                            whole(master_), updater_.state());
    restore_state(at, steps_, updater_, scaler_);
    for (std::size_t b = 0; b < plan_.buckets().size(); ++b) gather_parameters(b);
    backend_.fence();
  }

  /// What the trainer holds now, and the most it has held.
  memory_use memory() const noexcept {
    memory_use m;
    m.parameters = master_.size() * sizeof(master_type);
    m.gradients = gradient_.size() * sizeof(master_type);
    m.optimizer_state = updater_.parameters() * Updater::state_slots * sizeof(master_type);
    m.buffers = buffer_.size() * sizeof(master_type) + (low_.size() + low_slice_.size()) * sizeof(value_type);
    if constexpr (Backend::device_resident) m.device = m.total();
    return m;
  }
  memory_use peak_memory() const noexcept { return peak_; }

  int rank() const noexcept { return comm_.rank(); }
  int size() const noexcept { return comm_.size(); }
  /// Updates applied (a step that loss scaling skipped does not count).
  std::size_t steps() const noexcept { return steps_; }
  const loss_scaler& scaler() const noexcept { return scaler_; }
  const bucket_plan& plan() const noexcept { return plan_; }
  const shard_layout& layout() const noexcept { return layout_; }
  updater_type& updater() noexcept { return updater_; }

 private:
  template <class T>
  using span_of = typename Backend::template span<T>;
  template <class T>
  using buffer_of = typename Backend::template buffer<T>;
  using span = span_of<value_type>;
  static constexpr bool mixed = !std::same_as<value_type, master_type>;

  static std::string name() { return std::string(Backend::trainer_name) + "<" + std::string(Stage::name) + ">"; }
  template <class T>
  static buffer_of<T> allocate(std::size_t n) {
    return Backend::template allocate<T>(n);
  }
  template <class T>
  static span_of<T> whole(buffer_of<T>& b) noexcept {
    return Backend::whole(b);
  }

  std::size_t index_of(const bucket& b) const noexcept { return static_cast<std::size_t>(&b - plan_.buckets().data()); }
  bool reduces_in_model() const noexcept { return mixed && options_.reduce_in == reduce_precision::model; }
  // One padded bucket in the master precision, and in the model's (the same buffer unless mixed).
  span_of<master_type> padded(std::size_t b) noexcept { return whole(buffer_).first(layout_.padded(b)); }
  span wire(std::size_t b) noexcept {
    if constexpr (mixed) {
      return whole(low_).first(layout_.padded(b));
    } else {
      return padded(b);
    }
  }
  template <class T>
  span_of<T> my_slice(span_of<T> all, std::size_t b) const noexcept {
    return all.subspan(static_cast<std::size_t>(comm_.rank()) * layout_.slice(b), layout_.slice(b));
  }
  span_of<master_type> shard_part(buffer_of<master_type>& shard, std::size_t b) noexcept {
    return whole(shard).subspan(layout_.slice_offset(b), layout_.slice(b));
  }
  auto parameters() {
    return [this](std::size_t i) { return model_.parameters(i); };
  }
  auto gradients() {
    return [this](std::size_t i) { return model_.gradients(i); };
  }

  shard_identity identity() const {
    shard_identity id{std::string(Updater::name), static_cast<std::uint32_t>(Updater::state_slots),
                      static_cast<std::uint32_t>(sizeof(master_type)), {}, {}};
    for (const bucket& b : plan_.buckets()) id.parts.push_back(b.elements);
    for (std::size_t i = 0; i < plan_.tensor_count(); ++i) id.sizes.push_back(plan_.tensor_size(i));
    return id;
  }

  // Every rank of the group, and of the replicas, compares its plan and stage with the others'.
  void check_ranks_agree() {
    using field = dtrain::detail::agreed_field;
    const field fields[] = {
        field::count("tensors", plan_.tensor_count()),
        field::count("elements", plan_.elements()),
        field::digest("the tensors' sizes or their buckets (first_bucket_bytes, bucket_bytes)", plan_.fingerprint()),
        field::count("stage", Stage::stage),
        field::count("the model's value_type (dtype)", static_cast<std::uint64_t>(dtype_of_v<value_type>)),
        field::choice("reduce_in", options_.reduce_in, reduce_precision_names),
        field::flag("scaling.enabled", scaler_.enabled())};
    check_agreement(backend_, comm_, replicas_, fields, name(),
                    "the model, the buckets, the stage or the precision (every rank must build the same)");
  }

  void broadcast_parameters(std::size_t b) {
    const bucket& bk = plan_.buckets()[b];
    backend_.template pack<value_type>(bk, parameters(), wire(b));
    backend_.fence();
    comm_.broadcast(wire(b), options_.root);
    if constexpr (detail::has_replicas<Replicas>) replicas_.broadcast(wire(b), 0);
    backend_.template unpack<value_type>(bk, span_of<const value_type>(wire(b)), parameters());
  }

  void take_my_slice(std::size_t b) {
    backend_.template pack<value_type>(plan_.buckets()[b], parameters(), wire(b));
    backend_.convert(my_slice(wire(b), b), shard_part(master_, b));
  }

  // On the communication thread, or on `step`'s once that one is idle: bucket b's average,
  // this rank's slice of it into `gradient_` (and, under stage 1, all of it into the model).
  void reduce_gradients(std::size_t b) {
    if (reduces_in_model()) {
      reduce_bucket<value_type>(b, wire(b));
    } else {
      reduce_bucket<master_type>(b, padded(b));
    }
  }

  // The same, on `flat`: in the model's precision or the master's.
  template <class W>
  void reduce_bucket(std::size_t b, span_of<W> flat) {
    const bucket& bk = plan_.buckets()[b];
    backend_.await_gradients(bk.tensors);
    backend_.template pack<W>(bk, gradients(), flat);
    backend_.fence();
    if constexpr (Stage::stage == 1) {
      comm_.allreduce(flat, reduce_op::avg);
      if constexpr (detail::has_replicas<Replicas>) replicas_.allreduce(flat, reduce_op::avg);
      backend_.template unpack<W>(bk, span_of<const W>(flat), gradients());
      backend_.convert(my_slice(flat, b), shard_part(gradient_, b));
    } else {
      span_of<W> mine;
      if constexpr (std::same_as<W, master_type>) {
        mine = shard_part(gradient_, b);
      } else {
        mine = whole(low_slice_).first(layout_.slice(b));
      }
      comm_.reduce_scatter(span_of<const W>(flat), mine, reduce_op::avg);
      if constexpr (detail::has_replicas<Replicas>) replicas_.allreduce(mine, reduce_op::avg);
      if constexpr (!std::same_as<W, master_type>) backend_.convert(mine, shard_part(gradient_, b));
    }
    backend_.fence();
  }

  // Every rank's updated slice of bucket b, into every rank's model (in the model's precision).
  void gather_parameters(std::size_t b) {
    const span all = wire(b);
    backend_.convert(shard_part(master_, b), my_slice(all, b));
    backend_.fence();
    comm_.allgather(all);
    backend_.template unpack<value_type>(plan_.buckets()[b], span_of<const value_type>(all), parameters());
  }

  Backend backend_;
  Collective comm_;
  [[no_unique_address]] Replicas replicas_;
  updater_type updater_;
  Model& model_;
  trainer_options options_;
  loss_scaler scaler_;
  bucket_plan plan_;
  shard_layout layout_;
  buffer_of<master_type> buffer_;    // one padded bucket, in the master precision (when reduced in it)
  buffer_of<value_type> low_;        // mixed: one padded bucket in the model's (gathers, reductions)
  buffer_of<value_type> low_slice_;  // mixed stage 2 reducing in the model's precision: a slice
  buffer_of<master_type> master_;    // this rank's slices of the parameters
  buffer_of<master_type> gradient_;  // and of the averaged gradient
  std::optional<allreduce::detail::step_readiness> readiness_;  // refers to plan_
  memory_use peak_;
  std::size_t steps_ = 0;
  bool broken_ = false;
  std::optional<dtrain::detail::comm_thread> worker_;  // last: destroyed (joined) first
};

}  // namespace dtrain::sharded
