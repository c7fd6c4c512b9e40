#pragma once
/// @file
/// `sharded::trainer<Collective, zero3, Updater, Model>`: ZeRO stage 3, FSDP's FULL_SHARD. The
/// parameters are sharded too: no rank holds the whole model. The model (`unit_model`) runs
/// unit by unit and reads each unit's parameters through the trainer, which gathers them just
/// before the unit runs and frees them right after (Zhao et al., VLDB'23).
///
/// Each unit is one part of the shard layout (layout.hpp): its tensors side by side, padded to
/// a multiple of P, rank r owning slice r. In a step:
///  - forward: the first `parameters(u, k)` of a unit waits for its allgather; the next unit's
///    allgather is then posted to the communication thread (the prefetch), so it runs while
///    unit u computes, as long as fewer than `limit_all_gathers` units are gathered or being
///    gathered. `forward_done(u)` frees u's parameters.
///  - backward, once every unit's forward is done: the same, in reverse unit order;
///    `backward_done(u)` posts u's gradients' reduce-scatter (average), which overlaps the
///    previous unit's backward, and frees u's parameters and gradients once it has run.
///  - the updater steps this rank's slices, as at stages 1 and 2.
/// Gathers and reductions are posted from the model's thread in its call order, so every rank
/// issues the same collectives in the same order. With a `Replicas` collective (hybrid
/// sharding), each unit's gradient slice is averaged again across the replica group.
/// Mixed precision as at stages 1 and 2 (trainer.hpp): `float` master slices and state, units
/// gathered in the model's 16-bit type, gradients averaged in `options.reduce_in`'s precision.

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

#include "dtrain/concepts/trainable.hpp"
#include "dtrain/concepts/unit_model.hpp"
#include "dtrain/core/element.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/hash.hpp"
#include "dtrain/core/reduce_op.hpp"
#include "dtrain/core/trace.hpp"
#include "dtrain/detail/comm_thread.hpp"
#include "dtrain/sharded/agreement.hpp"
#include "dtrain/sharded/checkpoint.hpp"
#include "dtrain/sharded/layout.hpp"
#include "dtrain/sharded/options.hpp"

namespace dtrain::sharded {

template <class Collective, class Updater, unit_model Model, class Replicas>
  requires(trainable<Collective, Updater, Model> &&
           (!detail::has_replicas<Replicas> || trainable<Replicas, Updater, Model>))
class trainer<Collective, zero3, Updater, Model, Replicas> final : private unit_access<typename Model::value_type> {
 public:
  using value_type = typename Model::value_type;
  /// The master parameters', the averaged gradient's and the updater's type (trainer.hpp).
  using master_type = compute_type_t<value_type>;
  using batch_type = typename Model::batch_type;

  /// Initialises every unit on rank `options.root` (`Model::initialize`, one unit at a time),
  /// broadcasts it, and keeps this rank's slice. Collective: every rank constructs one.
  /// @throws dtrain::error `invalid_argument` on every rank if the ranks' units differ, or for
  ///   a bad root or `limit_all_gathers` of 0; the collective's errors.
  trainer(Collective comm, Updater updater, Model& model, trainer_options options = {})
    requires(!detail::has_replicas<Replicas>)
      : trainer(std::move(comm), Replicas{}, std::move(updater), model, std::move(options)) {}

  /// Hybrid sharding: sharded over `comm`'s group, replicated across `replicas`' (rank 0 of
  /// `replicas` gives every replica its start); each unit's gradient slice is averaged within
  /// the group, then across the replicas.
  trainer(Collective comm, Replicas replicas, Updater updater, Model& model, trainer_options options = {})
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
    std::vector<std::size_t> lengths;
    units_.resize(model_.unit_count());
    for (std::size_t u = 0; u < units_.size(); ++u) {
      units_[u].sizes = model_.unit_tensors(u);
      if (units_[u].sizes.empty()) {
        throw error(errc::invalid_argument, name() + ": unit " + std::to_string(u) + " has no tensors");
      }
      std::size_t length = 0;
      for (const std::size_t n : units_[u].sizes) {
        units_[u].offsets.push_back(length);
        length += n;
      }
      lengths.push_back(length);
    }
    layout_ = shard_layout(lengths, comm_.size());
    check_ranks_agree(lengths);
    master_.resize(layout_.shard_elements());
    gradient_.resize(layout_.shard_elements());
    for (std::size_t u = 0; u < units_.size(); ++u) take_my_slice(u);
    updater_.resize(layout_.shard_elements());
    peak_ = memory();
    worker_.emplace(trace::recorder::global());
  }

  trainer(const trainer&) = delete;
  trainer& operator=(const trainer&) = delete;

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
      result.loss = model_.forward_backward(batch, static_cast<unit_access<value_type>&>(*this));
      for (std::size_t u = 0; u < units_.size() && misuse_.empty(); ++u) {
        if (!units_[u].backwarded) misuse_ = "the model never called backward_done(" + std::to_string(u) + ")";
      }
      worker_->drain();
      release_all();
      if (!misuse_.empty()) throw error(errc::invalid_argument, name() + ": " + misuse_);
      result.skipped = !keep_step(comm_, replicas_, scaler_, std::span<master_type>(gradient_));
      if (!result.skipped) {
        step_info info;
        info.step = steps_ + 1;
        updater_.step(std::span<master_type>(master_), std::span<const master_type>(gradient_), 0, info);
        ++steps_;
      }
    } catch (...) {
      broken_ = true;
      try {
        worker_->drain();
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
    std::vector<master_type> whole(layout_.padded(u));
    fill_my_slice(u, std::span<master_type>(whole));
    comm_.allgather(std::span<master_type>(whole));
    whole.resize(unit_length(u));
    return whole;
  }

  /// Writes this rank's shard and, once every rank has, the manifest (checkpoint.hpp), as
  /// stages 1 and 2 do. Collective, between steps.
  void save(const std::string& prefix) {
    save_replicated(replicas_, [&] {
      save_sharded<master_type>(comm_, name(), prefix, identity(), state_of(steps_, updater_, scaler_),
                                std::span<const master_type>(master_), std::span<const master_type>(updater_.state()));
    });
  }

  /// Restores what `save` wrote, on this or another number of ranks. Collective, between steps.
  /// @throws dtrain::error as stages 1 and 2's `load`; nothing changes then.
  void load(const std::string& prefix) {
    const shard_state at = load_sharded<master_type>(comm_, name(), prefix, identity(), master_, updater_.state());
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
  Updater& updater() noexcept { return updater_; }

 private:
  using span = std::span<value_type>;

  struct unit {
    std::vector<std::size_t> sizes, offsets;  // of its tensors, in the unit
    std::vector<value_type> parameters;       // padded; while gathered
    std::vector<value_type> gradients;        // padded; from its first gradients() to its reduction
    std::vector<master_type> wide;            // mixed, reduced in the master precision: while reduced
    bool ready = false;                       // `parameters` gathered (under mutex_)
    std::uint64_t released = 0;               // times the model let it go (under mutex_)
    bool live = false;                        // gathered or being gathered (the model's thread only)
    bool forwarded = false, backwarded = false;
  };

  static std::string name() { return "sharded::trainer<zero3>"; }

  std::size_t unit_length(std::size_t u) const {
    return units_[u].offsets.back() + units_[u].sizes.back();
  }

  void check_unit(std::size_t u, std::size_t k, const char* call) const {
    if (u >= units_.size() || k >= units_[u].sizes.size()) {
      throw error(errc::invalid_argument, name() + ": " + call + "(" + std::to_string(u) + ", " + std::to_string(k) +
                                              "): the model has " + std::to_string(units_.size()) + " units" +
                                              (u < units_.size() ? ", unit " + std::to_string(u) + " has " +
                                                                       std::to_string(units_[u].sizes.size()) +
                                                                       " tensors"
                                                                 : std::string()));
    }
  }

  // unit_access: called by the model, on the thread that runs `step`.
  std::span<const value_type> parameters(std::size_t u, std::size_t k) override {
    check_unit(u, k, "parameters");
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
    return std::span<const value_type>(units_[u].parameters).subspan(units_[u].offsets[k], units_[u].sizes[k]);
  }

  span gradients(std::size_t u, std::size_t k) override {
    check_unit(u, k, "gradients");
    std::lock_guard lock(mutex_);
    if (units_[u].gradients.empty()) {
      units_[u].gradients.assign(layout_.padded(u), value_type(0));
      note_peak();
    }
    return span(units_[u].gradients).subspan(units_[u].offsets[k], units_[u].sizes[k]);
  }

  void forward_done(std::size_t u) override {
    check_unit(u, 0, "forward_done");
    if (std::exchange(units_[u].forwarded, true)) return misused("forward_done", u);
    ++forwarded_;
    units_[u].live = false;
    release_parameters(u);
  }

  void backward_done(std::size_t u) override {
    check_unit(u, 0, "backward_done");
    if (std::exchange(units_[u].backwarded, true)) return misused("backward_done", u);
    units_[u].live = false;
    release_parameters(u);
    post([this, u] {
      unit& x = units_[u];
      {
        std::lock_guard lock(mutex_);
        if (x.gradients.empty()) x.gradients.assign(layout_.padded(u), value_type(0));  // it wrote none
      }
      if constexpr (std::same_as<value_type, master_type>) {
        reduce(std::span<const master_type>(x.gradients), shard_part(gradient_, u));
      } else if (options_.reduce_in == reduce_precision::model) {
        std::vector<value_type> mine(layout_.slice(u));
        reduce(std::span<const value_type>(x.gradients), std::span<value_type>(mine));
        convert(std::span<const value_type>(mine), shard_part(gradient_, u));
      } else {
        {
          std::lock_guard lock(mutex_);
          x.wide.resize(x.gradients.size());
          note_peak();
        }
        convert(std::span<const value_type>(x.gradients), std::span<master_type>(x.wide));
        reduce(std::span<const master_type>(x.wide), shard_part(gradient_, u));
      }
      std::lock_guard lock(mutex_);
      std::vector<value_type>().swap(x.gradients);
      std::vector<master_type>().swap(x.wide);
    });
  }

  // A unit's gradients averaged over the group (and the replicas) into this rank's slice `mine`.
  template <class W>
  void reduce(std::span<const W> whole, std::span<W> mine) {
    comm_.reduce_scatter(whole, mine, reduce_op::avg);
    if constexpr (detail::has_replicas<Replicas>) replicas_.allreduce(mine, reduce_op::avg);
  }

  void misused(const char* call, std::size_t u) {
    if (misuse_.empty()) misuse_ = "the model called " + std::string(call) + "(" + std::to_string(u) + ") twice";
  }

  std::size_t live_units() const {
    return static_cast<std::size_t>(std::count_if(units_.begin(), units_.end(), [](const unit& x) { return x.live; }));
  }

  std::span<master_type> shard_part(std::vector<master_type>& shard, std::size_t u) {
    return std::span<master_type>(shard).subspan(layout_.slice_offset(u), layout_.slice(u));
  }

  // This rank's slice of unit u, into its place in `whole` (of the model's or the master's type).
  template <class T>
  void fill_my_slice(std::size_t u, std::span<T> whole) {
    convert(shard_part(master_, u), whole.subspan(static_cast<std::size_t>(comm_.rank()) * layout_.slice(u),
                                                  layout_.slice(u)));
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
      std::vector<value_type> whole(layout_.padded(u));
      fill_my_slice(u, span(whole));
      comm_.allgather(span(whole));
      {
        std::lock_guard lock(mutex_);
        if (units_[u].released != released) return;  // let go before it landed (never read): drop it
        units_[u].parameters = std::move(whole);
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
    std::vector<value_type>().swap(units_[u].parameters);
  }

  // After a step (or its failure), with the communication thread idle.
  void release_all() {
    std::lock_guard lock(mutex_);
    for (unit& x : units_) {
      x.live = x.ready = false;
      std::vector<value_type>().swap(x.parameters);
      std::vector<value_type>().swap(x.gradients);
      std::vector<master_type>().swap(x.wide);
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
    return m;
  }
  void note_peak() {  // under mutex_
    peak_.raise_to(memory_locked());
  }

  shard_identity identity() const {
    shard_identity id{std::string(Updater::name), static_cast<std::uint32_t>(Updater::state_slots),
                      static_cast<std::uint32_t>(sizeof(master_type)), {}, {}};
    for (std::size_t u = 0; u < units_.size(); ++u) {
      id.parts.push_back(unit_length(u));
      id.sizes.insert(id.sizes.end(), units_[u].sizes.begin(), units_[u].sizes.end());
    }
    return id;
  }

  void check_ranks_agree(const std::vector<std::size_t>& lengths) {
    fnv1a h;
    h.word(static_cast<std::uint64_t>(dtype_of_v<value_type>));
    h.word(static_cast<std::uint64_t>(options_.reduce_in));
    h.word(static_cast<std::uint64_t>(scaler_.enabled()));
    for (const unit& x : units_) {
      h.word(x.sizes.size());
      for (const std::size_t n : x.sizes) h.word(n);
    }
    std::size_t total = 0;
    for (const std::size_t n : lengths) total += n;
    const build_digest mine{static_cast<std::int64_t>(units_.size()), static_cast<std::int64_t>(total),
                            static_cast<std::int64_t>(h.value())};
    const std::string what = "the model's units or the precision (every rank must build the same)";
    sharded::check_ranks_agree(comm_, mine, name(), what, "units", "elements");
    if constexpr (detail::has_replicas<Replicas>) {
      sharded::check_ranks_agree(replicas_, mine, name() + " across replicas", what, "units", "elements");
    }
  }

  // Unit u, initialised on the root and broadcast; this rank keeps its slice. One unit at a time.
  void take_my_slice(std::size_t u) {
    std::vector<master_type> whole(layout_.padded(u), master_type(0));
    const std::span<master_type> all(whole);
    if (comm_.rank() == options_.root) {
      for (std::size_t k = 0; k < units_[u].sizes.size(); ++k) {
        model_.initialize(u, k, all.subspan(units_[u].offsets[k], units_[u].sizes[k]));
      }
    }
    comm_.broadcast(all, options_.root);
    if constexpr (detail::has_replicas<Replicas>) replicas_.broadcast(all, 0);
    const auto mine = all.subspan(static_cast<std::size_t>(comm_.rank()) * layout_.slice(u), layout_.slice(u));
    std::copy(mine.begin(), mine.end(), shard_part(master_, u).begin());
  }

  Collective comm_;
  [[no_unique_address]] Replicas replicas_;
  Updater updater_;
  Model& model_;
  trainer_options options_;
  loss_scaler scaler_;
  shard_layout layout_;
  std::vector<unit> units_;
  std::vector<master_type> master_;    // this rank's slices of the parameters
  std::vector<master_type> gradient_;  // and of the averaged gradient
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
