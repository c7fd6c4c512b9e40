#pragma once
/// @file
/// `sharded::basic_unit_trainer<Backend, Collective, Updater, Model, Replicas>`: ZeRO stage 3,
/// FSDP's FULL_SHARD. The parameters are sharded too: no rank holds the whole model. The model (a
/// `unit_model`) runs unit by unit and reads each unit's parameters through the trainer, which
/// gathers them just before the unit runs and frees them right after (Zhao et al., VLDB'23).
/// `sharded::trainer<Collective, zero3, Updater, Model>` is it on host memory (host_backend.hpp),
/// `sharded::device_trainer<Collective, zero3, ...>` on Thrust's device memory (device_trainer.hpp,
/// thrust_backend.hpp), where a unit's buffers are freed and reduced once its kernels, enqueued on
/// the model's stream, are done (`forward_done` and `backward_done` wait for them).
///
/// Each unit is one part of the shard layout (layout.hpp). A step gathers each unit just before
/// the model reads it (prefetching the next under `limit_all_gathers`), frees it at
/// `forward_done`, gathers it again for backward, reduce-scatters its gradients at
/// `backward_done` while the previous unit computes, and updates this rank's slices; every
/// collective is posted from the model's thread in its call order, alike on every rank
/// (docs/sharded.md, "Stage 3", says each step in full). Hybrid sharding and mixed precision as
/// at stages 1 and 2 (trainer.hpp).

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/concepts/unit_model.hpp"
#include "dtrain/core/element.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/reduce_op.hpp"
#include "dtrain/core/trace.hpp"
#include "dtrain/detail/comm_thread.hpp"
#include "dtrain/sharded/agreement.hpp"
#include "dtrain/sharded/checkpoint.hpp"
#include "dtrain/sharded/layout.hpp"
#include "dtrain/sharded/options.hpp"
#include "dtrain/sharded/unit_shapes.hpp"

namespace dtrain::sharded {

/// What a stage-3 trainer gives its model over `Backend`'s memory.
template <class Backend, class T>
using unit_access_of = unit_access<T, typename Backend::template span<const T>, typename Backend::template span<T>>;

/// Stage 3 over `Backend`'s memory.
template <class Backend, class Collective, class Updater, class Model, class Replicas>
class basic_unit_trainer : private unit_access_of<Backend, typename Model::value_type> {
 public:
  using value_type = typename Model::value_type;
  /// The master parameters', the averaged gradient's and the updater's type (trainer.hpp).
  using master_type = typename Backend::master_type;
  using batch_type = typename Model::batch_type;
  /// The updater the trainer steps: `Updater`, or its rule on the device (`device_updater`).
  using updater_type = typename Backend::template updater_for<Updater>;

  /// Initialises every unit on rank `options.root` (`Model::initialize`, one unit at a time),
  /// broadcasts it, and keeps this rank's slice. Collective: every rank constructs one.
  /// @throws dtrain::error `invalid_argument` on every rank if the ranks' units differ, or for
  ///   a bad root or `limit_all_gathers` of 0; the collective's errors.
  basic_unit_trainer(Collective comm, Updater updater, Model& model, trainer_options options = {})
    requires(!detail::has_replicas<Replicas>)
      : basic_unit_trainer(std::move(comm), Replicas{}, std::move(updater), model, std::move(options)) {}

  /// Hybrid sharding: sharded over `comm`'s group, replicated across `replicas`' (rank 0 of
  /// `replicas` gives every replica its start); each unit's gradient slice is averaged within
  /// the group, then across the replicas.
  basic_unit_trainer(Collective comm, Replicas replicas, Updater updater, Model& model, trainer_options options = {})
      : comm_(std::move(comm)),
        replicas_(std::move(replicas)),
        updater_(std::move(updater)),
        model_(model),
        options_(std::move(options)),
        scaler_(options_.scaling) {
    if (options_.root < 0 || options_.root >= comm_.size() || options_.limit_all_gathers == 0) {
      throw error(errc::invalid_argument, name() + ": root " + std::to_string(options_.root) + " of " +
                                              std::to_string(comm_.size()) + " ranks, limit_all_gathers " +
                                              std::to_string(options_.limit_all_gathers) + ": both must be in range");
    }
    dtrain::detail::check_loss_scaling<Model>(scaler_, name());
    shapes_ = unit_shapes(model_, name());
    units_.resize(shapes_.count());
    layout_ = shard_layout(shapes_.lengths(), comm_.size());
    check_ranks_agree();
    master_ = Backend::template allocate<master_type>(layout_.shard_elements());
    gradient_ = Backend::template allocate<master_type>(layout_.shard_elements());
    for (std::size_t u = 0; u < units_.size(); ++u) take_my_slice(u);
    backend_.prepare(updater_, layout_.shard_elements(), model_, 0);
    peak_ = memory();
    worker_.emplace(trace::recorder::global());
    post([this] { backend_.bind_thread(); });  // a failure wakes a model waiting for a unit
  }

  basic_unit_trainer(const basic_unit_trainer&) = delete;
  basic_unit_trainer& operator=(const basic_unit_trainer&) = delete;

  /// One step on this rank's `batch`: the model's pass unit by unit, gradients averaged into
  /// the shards, this rank's slices updated. Collective: every rank calls `step` alike.
  /// @throws dtrain::error the collective's errors; `invalid_argument` if the model misses or
  ///   repeats a unit's `forward_done` or `backward_done`. After an error the trainer is broken.
  step_result step(const batch_type& batch) {
    if (broken_) throw error(errc::broken, name() + ": an earlier step failed; rebuild the trainer");
    step_result result;
    if (options_.learning_rate) updater_.set_learning_rate(options_.learning_rate(steps_));
    result.learning_rate = updater_.learning_rate();
    result.loss_scale = scaler_.scale();
    dtrain::detail::set_loss_scale(model_, scaler_);
    for (unit& x : units_) x.forwarded = x.backwarded = false;
    forwarded_ = 0;
    misuse_.clear();
    try {
      result.loss = model_.forward_backward(batch, static_cast<unit_access_of<Backend, value_type>&>(*this));
      for (std::size_t u = 0; u < units_.size() && misuse_.empty(); ++u) {
        if (!units_[u].backwarded) misuse_ = "the model never called backward_done(" + std::to_string(u) + ")";
      }
      worker_->drain();
      backend_.settle(model_);  // a unit never finished may still have kernels on its buffers
      release_all();
      if (!misuse_.empty()) throw error(errc::invalid_argument, name() + ": " + misuse_);
      result.skipped = !backend_.keep_step(comm_, replicas_, scaler_, whole(gradient_));
      if (!result.skipped) {
        backend_.update(updater_, model_, whole(master_), span_of<const master_type>(whole(gradient_)), steps_ + 1);
        ++steps_;
      }
    } catch (...) {
      broken_ = true;
      try {
        worker_->drain();
        backend_.settle(model_);
      } catch (...) {
      }
      release_all();
      throw;
    }
    return result;
  }

  /// Unit `u`'s master parameters, whole (its tensors side by side): for an export, or a check.
  /// Collective: every rank calls it alike, between steps.
  std::vector<master_type> unit_parameters(std::size_t u) {
    buffer_of<master_type> all = Backend::template allocate<master_type>(layout_.padded(u));
    fill_my_slice(u, whole(all));
    backend_.fence();
    comm_.allgather(whole(all));
    std::vector<master_type> out = on_host(whole(all));
    out.resize(shapes_.length(u));
    return out;
  }

  /// Writes this rank's shard and, once every rank has, the manifest (checkpoint.hpp), as
  /// stages 1 and 2 do. Collective, between steps.
  void save(const std::string& prefix) {
    save_trainer_shards<master_type>(backend_, comm_, replicas_, name(), prefix, identity(),
                                     state_of(steps_, updater_, scaler_), whole(master_), updater_.state());
  }

  /// Restores what `save` wrote, on this or another number of ranks. Collective, between steps.
  /// @throws dtrain::error as stages 1 and 2's `load`; nothing changes then.
  void load(const std::string& prefix) {
    const shard_state at = load_trainer_shards<master_type>(backend_, comm_, name(), prefix, identity(),
                                                            whole(master_), updater_.state());
    restore_state(at, steps_, updater_, scaler_);
  }

  /// What the trainer holds now, and the most each part of it has held.
  memory_use memory() const {
    std::lock_guard lock(mutex_);
    return memory_locked();
  }
  memory_use peak_memory() const {
    std::lock_guard lock(mutex_);
    return peak_;
  }

  int rank() const noexcept { return comm_.rank(); }
  int size() const noexcept { return comm_.size(); }
  /// Updates applied (a step that loss scaling skipped does not count).
  std::size_t steps() const noexcept { return steps_; }
  const loss_scaler& scaler() const noexcept { return scaler_; }
  const shard_layout& layout() const noexcept { return layout_; }
  updater_type& updater() noexcept { return updater_; }

 private:
  template <class T>
  using span_of = typename Backend::template span<T>;
  template <class T>
  using buffer_of = typename Backend::template buffer<T>;
  using span = span_of<value_type>;
  static constexpr bool mixed = !std::same_as<value_type, master_type>;

  struct unit {
    buffer_of<value_type> parameters;         // padded; while gathered
    buffer_of<value_type> gradients;          // padded; from its first gradients() to its reduction
    buffer_of<master_type> wide;              // mixed, reduced in the master precision: while reduced
    bool ready = false;                       // `parameters` gathered (under mutex_)
    std::uint64_t released = 0;               // times the model let it go (under mutex_)
    bool live = false;                        // gathered or being gathered (the model's thread only)
    bool forwarded = false, backwarded = false;
  };

  static std::string name() { return std::string(Backend::trainer_name) + "<zero3>"; }
  template <class T>
  static span_of<T> whole(buffer_of<T>& b) noexcept {
    return Backend::whole(b);
  }
  // A checkpoint's (or an export's) host copy.
  std::vector<master_type> on_host(span_of<master_type> s) {
    return backend_.template to_host<master_type>(span_of<const master_type>(s));
  }


  // unit_access: called by the model, on the thread that runs `step`.
  span_of<const value_type> parameters(std::size_t u, std::size_t k) override {
    shapes_.check(u, k, "parameters", name());
    if (!units_[u].live) gather(u);
    const bool backward = forwarded_ == units_.size();
    const std::size_t next = backward ? u - 1 : u + 1;  // u - 1 wraps past 0: out of range
    if (next < units_.size() && !units_[next].live && live_units() < options_.limit_all_gathers) gather(next);
    std::unique_lock lock(mutex_);
    ready_cv_.wait(lock, [&] { return units_[u].ready || failed_; });
    if (!units_[u].ready) {
      lock.unlock();
      worker_->drain();  // rethrows the collective's error
      throw error(errc::broken, name() + ": unit " + std::to_string(u) + " was not gathered");
    }
    return span_of<const value_type>(whole(units_[u].parameters)).subspan(shapes_.offset(u, k), shapes_.size(u, k));
  }

  span gradients(std::size_t u, std::size_t k) override {
    shapes_.check(u, k, "gradients", name());
    if (units_[u].backwarded) {  // its buffer is being reduced, then freed
      throw error(errc::invalid_argument, name() + ": gradients(" + std::to_string(u) + ", " + std::to_string(k) +
                                              ") after backward_done(" + std::to_string(u) + ")");
    }
    std::lock_guard lock(mutex_);
    if (units_[u].gradients.size() == 0) {
      units_[u].gradients = backend_.template zeros<value_type>(layout_.padded(u), model_);
      note_peak();
    }
    return whole(units_[u].gradients).subspan(shapes_.offset(u, k), shapes_.size(u, k));
  }

  void forward_done(std::size_t u) override {
    shapes_.check(u, 0, "forward_done", name());
    if (std::exchange(units_[u].forwarded, true)) return misused("forward_done", u);
    ++forwarded_;
    units_[u].live = false;
    backend_.settle(model_);  // the unit's kernels are done with its parameters
    release_parameters(u);
  }

  void backward_done(std::size_t u) override {
    shapes_.check(u, 0, "backward_done", name());
    if (std::exchange(units_[u].backwarded, true)) return misused("backward_done", u);
    units_[u].live = false;
    {
      std::lock_guard lock(mutex_);
      if (units_[u].gradients.size() == 0) {  // it wrote none
        units_[u].gradients = backend_.template zeros<value_type>(layout_.padded(u), model_);
        note_peak();
      }
    }
    backend_.settle(model_);  // the unit's gradients are final, and its parameters unread
    release_parameters(u);
    post([this, u] {
      unit& x = units_[u];
      const span_of<const value_type> gradients(whole(x.gradients));
      if constexpr (!mixed) {
        reduce<master_type>(gradients, shard_part(gradient_, u));
      } else if (options_.reduce_in == reduce_precision::model) {
        buffer_of<value_type> mine = Backend::template allocate<value_type>(layout_.slice(u));
        reduce<value_type>(gradients, whole(mine));
        backend_.convert(span_of<const value_type>(whole(mine)), shard_part(gradient_, u));
        backend_.fence();  // before `mine` is freed
      } else {
        {
          std::lock_guard lock(mutex_);
          x.wide = Backend::template allocate<master_type>(x.gradients.size());
          note_peak();
        }
        backend_.convert(gradients, whole(x.wide));
        backend_.fence();
        reduce<master_type>(span_of<const master_type>(whole(x.wide)), shard_part(gradient_, u));
      }
      backend_.fence();
      std::lock_guard lock(mutex_);
      x.gradients = buffer_of<value_type>();
      x.wide = buffer_of<master_type>();
    });
  }

  // A unit's gradients averaged over the group (and the replicas) into this rank's slice `mine`.
  template <class W>
  void reduce(span_of<const W> all, span_of<W> mine) {
    comm_.reduce_scatter(all, mine, reduce_op::avg);
    if constexpr (detail::has_replicas<Replicas>) replicas_.allreduce(mine, reduce_op::avg);
  }

  void misused(const char* call, std::size_t u) {
    if (misuse_.empty()) misuse_ = "the model called " + std::string(call) + "(" + std::to_string(u) + ") twice";
  }

  std::size_t live_units() const {
    return static_cast<std::size_t>(std::count_if(units_.begin(), units_.end(), [](const unit& x) { return x.live; }));
  }

  span_of<master_type> shard_part(buffer_of<master_type>& shard, std::size_t u) {
    return whole(shard).subspan(layout_.slice_offset(u), layout_.slice(u));
  }

  // This rank's slice of unit u, into its place in `all` (of the model's or the master's type).
  template <class T>
  void fill_my_slice(std::size_t u, span_of<T> all) {
    backend_.convert(span_of<const master_type>(shard_part(master_, u)),
                     all.subspan(static_cast<std::size_t>(comm_.rank()) * layout_.slice(u), layout_.slice(u)));
  }

  // Posts unit u's allgather; the model's thread marks it live now, so the decision to gather
  // depends only on the model's calls, alike on every rank.
  void gather(std::size_t u) {
    units_[u].live = true;
    std::uint64_t released;
    {
      std::lock_guard lock(mutex_);
      released = units_[u].released;
    }
    post([this, u, released] {
      buffer_of<value_type> all = Backend::template allocate<value_type>(layout_.padded(u));
      fill_my_slice<value_type>(u, whole(all));
      backend_.fence();
      comm_.allgather(whole(all));
      {
        std::lock_guard lock(mutex_);
        if (units_[u].released != released) return;  // let go before it landed (never read): drop it
        units_[u].parameters = std::move(all);
        units_[u].ready = true;
        note_peak();
      }
      ready_cv_.notify_all();
    });
  }

  // The model lets unit u go: its parameters are freed, or, if its gather has not landed yet
  // (the model never read it), dropped when it lands.
  void release_parameters(std::size_t u) {
    std::lock_guard lock(mutex_);
    ++units_[u].released;
    units_[u].ready = false;
    units_[u].parameters = buffer_of<value_type>();
  }

  // After a step (or its failure), with the communication thread idle.
  void release_all() {
    std::lock_guard lock(mutex_);
    for (unit& x : units_) {
      x.live = x.ready = false;
      x.parameters = buffer_of<value_type>();
      x.gradients = buffer_of<value_type>();
      x.wide = buffer_of<master_type>();
    }
  }

  // A job for the communication thread that, if it fails, wakes a model thread waiting for a unit.
  void post(std::function<void()> job) {
    worker_->post([this, job = std::move(job)] {
      try {
        job();
      } catch (...) {
        {
          std::lock_guard lock(mutex_);
          failed_ = true;
        }
        ready_cv_.notify_all();
        throw;
      }
    });
  }

  memory_use memory_locked() const {
    memory_use m;
    m.parameters = master_.size() * sizeof(master_type);
    m.gradients = gradient_.size() * sizeof(master_type);
    m.optimizer_state = updater_.parameters() * Updater::state_slots * sizeof(master_type);
    for (const unit& x : units_) {
      m.gathered += x.parameters.size() * sizeof(value_type);
      m.unit_gradients += x.gradients.size() * sizeof(value_type) + x.wide.size() * sizeof(master_type);
    }
    if constexpr (Backend::device_resident) m.device = m.total();
    return m;
  }
  void note_peak() {  // under mutex_
    peak_.raise_to(memory_locked());
  }

  shard_identity identity() const {
    shard_identity id{std::string(Updater::name), static_cast<std::uint32_t>(Updater::state_slots),
                      static_cast<std::uint32_t>(sizeof(master_type)), {}, {}};
    shapes_.describe(id);
    return id;
  }

  void check_ranks_agree() {
    using field = dtrain::detail::agreed_field;
    const field fields[] = {
        field::count("units", shapes_.count()),
        field::count("elements", shapes_.elements()),
        field::digest("the units' tensor sizes", shapes_.digest()),
        field::count("the model's value_type (dtype)", static_cast<std::uint64_t>(dtype_of_v<value_type>)),
        field::choice("reduce_in", options_.reduce_in, reduce_precision_names),
        field::flag("scaling.enabled", scaler_.enabled())};
    check_agreement(backend_, comm_, replicas_, fields, name(),
                    "the model's units or the precision (every rank must build the same)");
  }

  // Unit u, initialised on the root (in host memory) and broadcast; this rank keeps its slice.
  // One unit at a time.
  void take_my_slice(std::size_t u) {
    std::vector<master_type> initial(layout_.padded(u), master_type(0));
    if (comm_.rank() == options_.root) {
      for (std::size_t k = 0; k < shapes_.tensors(u); ++k) {
        model_.initialize(u, k, std::span<master_type>(initial).subspan(shapes_.offset(u, k), shapes_.size(u, k)));
      }
    }
    buffer_of<master_type> all = Backend::template allocate<master_type>(initial.size());
    backend_.template from_host<master_type>(whole(all), std::span<const master_type>(initial));
    comm_.broadcast(whole(all), options_.root);
    if constexpr (detail::has_replicas<Replicas>) replicas_.broadcast(whole(all), 0);
    const std::size_t slice = layout_.slice(u), mine = static_cast<std::size_t>(comm_.rank()) * slice;
    backend_.convert(span_of<const master_type>(whole(all).subspan(mine, slice)), shard_part(master_, u));
    backend_.fence();
  }

  Backend backend_;
  Collective comm_;
  [[no_unique_address]] Replicas replicas_;
  updater_type updater_;
  Model& model_;
  trainer_options options_;
  loss_scaler scaler_;
  unit_shapes shapes_;
  shard_layout layout_;
  std::vector<unit> units_;
  buffer_of<master_type> master_;    // this rank's slices of the parameters
  buffer_of<master_type> gradient_;  // and of the averaged gradient
  std::size_t forwarded_ = 0;         // units whose forward is done this step
  std::string misuse_;
  mutable std::mutex mutex_;          // units' buffers and readiness, peak_, failed_
  std::condition_variable ready_cv_;
  bool failed_ = false;
  memory_use peak_;
  std::size_t steps_ = 0;
  bool broken_ = false;
  std::optional<dtrain::detail::comm_thread> worker_;  // last: destroyed (joined) first
};

}  // namespace dtrain::sharded
