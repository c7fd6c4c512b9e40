#pragma once
/// @file
/// `allreduce::basic_trainer<Backend, Collective, Updater, Model>`: the one allreduce trainer,
/// whatever memory its model's tensors live in. `Backend` is that memory's policy (Aluminum's
/// backend-as-template-argument): `host_backend` (std::span, std::copy) or `thrust_backend`
/// (Thrust device buffers, streams and events). Users write `trainer` (trainer.hpp) and
/// `device_trainer` (device_trainer.hpp), which pick the backend and state the concepts.
///
/// What happens (docs/trainers.md has the details and the timeline):
///  - At construction rank `root`'s parameters are broadcast, and the bucket plan (tensor sizes,
///    bucket boundaries, options) is compared across ranks: a mismatch raises the same error on
///    every rank instead of a hang.
///  - In `step`, the model reports each gradient as final; once every tensor of the next bucket
///    (in plan order) is final, that bucket's allreduce is queued to the communication thread.
///    Buckets therefore go out in the same order on every rank, whatever the timing.
///  - fp16 / bf16 compression (host backend) divides by the world size, reduces in half
///    precision and widens back, halving the bytes on the wire. Top-k (host backend) sends each
///    bucket's largest entries after error feedback as allgathered (index, value) pairs.
///  - Local SGD (`average_every = tau > 1`): each rank steps on its own gradients and the
///    parameters are averaged every tau steps; `local_sgd_after` runs synchronous steps first
///    (post-local SGD).
///  - Gradient accumulation (DDP's `no_sync`): `accumulate(batch)` runs forward and backward
///    with no communication and no update; the next `step` averages its gradient with the
///    accumulated ones, so k - 1 `accumulate`s and a `step` equal one step on the k batches.
///  - `find_unused_parameters` and `clip_grad_norm` as in PyTorch (trainer_options.hpp).
///  - Mixed precision (a 16-bit model, `mixed_backend`): float master weights and state, gradients
///    averaged in `options.reduce_in`'s precision, and with `options.scaling` a step whose
///    gradients overflowed on any rank skipped on every rank.

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/allreduce/bucket_plan.hpp"
#include "dtrain/allreduce/checkpoint.hpp"
#include "dtrain/allreduce/trainer_checkpoints.hpp"
#include "dtrain/allreduce/trainer_options.hpp"
#include "dtrain/compress/topk.hpp"
#include "dtrain/concepts/collective.hpp"
#include "dtrain/concepts/model.hpp"
#include "dtrain/core/element.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/memory_use.hpp"
#include "dtrain/core/reduce_op.hpp"
#include "dtrain/core/trace.hpp"
#include "dtrain/detail/comm_thread.hpp"
#include "dtrain/updater/loss_scaler.hpp"

namespace dtrain::allreduce {

/// Synchronous data-parallel training of `Model` over `Collective`, updated by `Updater`, with
/// tensors in `Backend`'s memory. Not thread-safe: one thread calls `step`. The collective
/// belongs to the trainer's communication thread; use `with_collective` to run other collectives
/// in order with it.
template <class Backend, class Collective, class Updater, class Model>
class basic_trainer : public trainer_checkpoints<basic_trainer<Backend, Collective, Updater, Model>> {
  friend class trainer_checkpoints<basic_trainer>;

 public:
  using value_type = typename Model::value_type;
  using batch_type = typename Model::batch_type;
  using updater_type = typename Backend::template updater_for<Updater>;

  /// Broadcasts rank `options.root`'s parameters and checks that every rank planned the same
  /// buckets. Collective: every rank constructs its trainer.
  /// @throws dtrain::error `invalid_argument` (on every rank) if the ranks' models or options
  ///   differ, `unsupported` if compression is asked of a backend or collective without 16-bit
  ///   types, and the collective's errors (timeout naming the missing rank, peer_lost, ...).
  basic_trainer(Collective comm, Updater updater, Model& model, trainer_options options = {})
      : comm_(std::move(comm)),
        updater_(std::move(updater)),
        model_(model),
        options_(std::move(options)),
        tracer_(options_.tracer != nullptr ? *options_.tracer : trace::recorder::global()),
        scaler_(options_.scaling) {
    const std::vector<std::size_t> sizes = detail::tensor_sizes(model_, name());
    if constexpr (Backend::mixed) backend_ = Backend(options_.reduce_in);
    if (options_.average_every == 0) options_.average_every = 1;
    if (options_.root < 0 || options_.root >= comm_.size()) {
      throw error(errc::invalid_argument, name() + ": root " + std::to_string(options_.root) +
                                              " is not a rank of this group of " + std::to_string(comm_.size()));
    }
    if (options_.compress != compression::none && !supports_compression()) {
      throw error(errc::unsupported, name() + ": " + std::string(Backend::no_compression));
    }
    if (options_.compress == compression::topk) (void)topk_count(1, options_.topk_density);  // refuses a bad density
    if (!Backend::host_tensors && (options_.find_unused_parameters || options_.clip_grad_norm > 0 ||
                                   options_.compress == compression::topk)) {
      throw error(errc::unsupported,
                  name() + ": top-k, find_unused_parameters and clip_grad_norm are host-only so far");
    }
    if (Backend::mixed && (options_.average_every > 1 || options_.clip_grad_norm > 0)) {
      throw error(errc::unsupported, name() + ": local SGD and clip_grad_norm of a 16-bit model are not built yet");
    }
    if (!Backend::mixed && scaler_.enabled()) {
      throw error(errc::invalid_argument, name() + ": loss scaling is for 16-bit models");
    }
    dtrain::detail::check_loss_scaling<Model>(scaler_, name());
    const std::size_t bytes = std::accumulate(sizes.begin(), sizes.end(), std::size_t{0}) * sizeof(value_type);
    const std::size_t first =
        first_bucket_capacity(options_.first_bucket_bytes, bytes, detail::every_rank_has_spare_cores(backend_, comm_));
    plan_ = bucket_plan(sizes, sizeof(value_type), first, options_.bucket_bytes);
    contiguous_ = detail::contiguous_buckets(plan_, model_);
    backend_.reserve(plan_);
    check_plan_matches();
    backend_.settle(model_);  // the model may still be initialising its parameters
    for (const bucket& b : plan_.buckets()) run_bucket(b, role::broadcast_parameters);
    backend_.prepare(updater_, plan_.elements(), model_);
    readiness_.emplace(plan_);
    tracer_.set_rank(comm_.rank());
    tracer_.name_thread("compute");
    worker_.emplace(tracer_);
    worker_->post([this] { backend_.bind_thread(); });
  }

  basic_trainer(const basic_trainer&) = delete;
  basic_trainer& operator=(const basic_trainer&) = delete;

  /// Stops the communication thread after the jobs already queued.
  ~basic_trainer() { tracer_.flush(); }

  /// One training step on this rank's `batch`: forward and backward, gradients averaged across
  /// ranks (or, under local SGD, parameters averaged every tau steps), one update. On a device
  /// the update is enqueued on the model's stream when `step` returns.
  /// Collective: every rank calls `step` the same number of times.
  /// @throws dtrain::error the collective's errors; `invalid_argument` if the model reported a
  ///   tensor twice, one out of range, or not all of them. After an error the trainer is broken.
  step_result step(const batch_type& batch) {
    using clock = std::chrono::steady_clock;
    if (broken_) throw error(errc::broken, name() + ": an earlier step failed; rebuild the trainer");
    trace::scope whole("step", "train", tracer_);
    const auto t0 = clock::now();
    step_result result;
    if (options_.learning_rate) updater_.set_learning_rate(options_.learning_rate(steps_));
    result.learning_rate = updater_.learning_rate();
    result.batches = accumulated_ + 1;
    result.loss_scale = scaler_.scale();
    dtrain::detail::set_loss_scale(model_, scaler_);
    const bool sync = !local_sgd_now();

    readiness_->reset();
    auto on_ready = [&](std::size_t tensor) {
      if (!readiness_->report(tensor)) return;
      if constexpr (Backend::host_tensors && !Backend::mixed) {
        if (accumulated_ > 0) {  // this batch's gradient joins the accumulated ones: their mean
          backend_.fold_accumulated(model_.gradients(tensor), accumulation(tensor),
                                    1.0 / static_cast<double>(accumulated_ + 1));
        }
      }
      if (!sync) return;
      backend_.gradient_final(model_, tensor);
      if (options_.overlap) launch_ready_buckets();
    };
    try {
      {
        trace::scope s("forward+backward", "compute", tracer_);
        result.loss = model_.forward_backward(batch, gradient_ready(on_ready));
        report_unused(on_ready);
      }
      const auto t1 = clock::now();
      const std::string misuse = readiness_->finish();
      {
        trace::scope s("wait for gradients", "communication", tracer_);
        worker_->drain();
        if (!misuse.empty()) throw error(errc::invalid_argument, name() + ": " + misuse);
        // The buckets still unlaunched (at least the last) have nothing left to overlap with:
        // reduce them here, now that the communication thread is idle, rather than pay a
        // thread hand-off (on a busy machine, a wait for a core) per step.
        if (sync) {
          const auto inline_start = clock::now();
          trace::scope r("allreduce gradients", "communication", tracer_);
          while (const bucket* b = readiness_->take_next()) run_bucket(*b, role::average_gradients);
          inline_seconds_ += std::chrono::duration<double>(clock::now() - inline_start).count();
        }
      }
      accumulated_ = 0;
      const auto t2 = clock::now();
      if constexpr (Backend::mixed) result.skipped = !backend_.keep_step(comm_, scaler_);
      if (!result.skipped) update(result, sync);
      stats_.add_step(t0, t1, t2, clock::now());
      stats_.comm_seconds = worker_->busy_seconds() + inline_seconds_;
      stats_.bytes_reduced = bytes_reduced_;
    } catch (...) {
      broken_ = true;
      try {
        worker_->drain();  // the queued buckets reference this step's gradients
      } catch (...) {
      }
      throw;
    }
    return result;
  }

  /// Forward and backward on `batch` with no communication and no update (DDP's `no_sync`):
  /// the gradients are added to a running sum that the next `step` averages with its own.
  /// Local: ranks may accumulate different numbers of batches. @returns the batch's mean loss.
  /// @throws dtrain::error `invalid_argument` as `step` does for a model's misreports, and
  ///   `unsupported` on a backend without accumulation.
  double accumulate(const batch_type& batch) {
    if (broken_) throw error(errc::broken, name() + ": an earlier step failed; rebuild the trainer");
    if constexpr (!Backend::host_tensors || Backend::mixed) {
      throw error(errc::unsupported, name() + ": gradient accumulation is not implemented on this backend");
    } else {
      trace::scope s("forward+backward (accumulate)", "compute", tracer_);
      readiness_->reset();
      auto on_ready = [&](std::size_t tensor) { readiness_->report(tensor); };
      const double loss = model_.forward_backward(batch, gradient_ready(on_ready));
      report_unused(on_ready);
      if (const std::string& misuse = readiness_->finish(); !misuse.empty()) {
        throw error(errc::invalid_argument, name() + ": " + misuse);
      }
      if (accumulation_.empty()) accumulation_.assign(plan_.elements(), value_type(0));
      for (std::size_t i = 0; i < plan_.tensor_count(); ++i) backend_.add_to(accumulation(i), model_.gradients(i));
      ++accumulated_;
      return loss;
    }
  }

  /// Averages the parameters across ranks now (after the updates enqueued so far): the end of
  /// local SGD. Collective.
  void average_parameters() {
    backend_.settle(model_);
    for (const bucket& b : plan_.buckets()) post_bucket(b, role::average_parameters);
    worker_->drain();
  }

  /// Runs `f(collective)` on the communication thread, after every bucket queued before it, and
  /// waits for it. Use it for other collectives (metrics, sync batch norm), also from inside the
  /// model's `forward_backward`: calls happen in program order, so the same order on every rank.
  template <class F>
  void with_collective(F&& f) {
    worker_->post([this, &f] { f(comm_); });
    worker_->drain();
  }

  int rank() const noexcept { return comm_.rank(); }
  int size() const noexcept { return comm_.size(); }
  std::size_t steps() const noexcept { return steps_; }
  const bucket_plan& plan() const noexcept { return plan_; }
  const trainer_options& options() const noexcept { return options_; }
  const trainer_stats& stats() const noexcept { return stats_; }
  updater_type& updater() noexcept { return updater_; }

  /// Bytes the trainer holds now beyond the model's own tensors: its buckets and packing
  /// buffers, a 16-bit model's master copy and averaged gradient, the updater's state, the
  /// gradients `accumulate` keeps. Nothing of it shrinks (buffers grow to the largest bucket on
  /// first use), so between calls the peak so far is what it holds now.
  memory_use memory() const noexcept {
    memory_use m = backend_.memory();
    m.optimizer_state = updater_.parameters() * updater_type::state_slots * sizeof(master_type);
    if constexpr (Backend::device_resident) m.device += m.optimizer_state;
    m.gradients += accumulation_.size() * sizeof(value_type);
    return m;
  }
  memory_use peak_memory() const noexcept { return memory(); }

 private:
  enum class role { broadcast_parameters, average_gradients, average_parameters };
  using span = typename Backend::span;
  using master_type = typename Backend::master_type;
  using updater_policy = Updater;

  // Every tensor's update (Adam's state moves even where a gradient is 0), and local SGD's averaging.
  void update(step_result& result, bool sync) {
    if constexpr (Backend::host_tensors && !Backend::mixed) {
      const double max_norm = options_.clip_grad_norm;
      if (max_norm > 0) result.grad_norm = backend_.clip(model_, plan_.tensor_count(), max_norm);
    }
    {
      trace::scope s("update", "compute", tracer_);
      for (std::size_t i = 0; i < plan_.tensor_count(); ++i) {
        backend_.update(updater_, model_, i, plan_.parameter_offset(i), steps_ + 1);
      }
    }
    ++steps_;
    if (!sync && (steps_ - options_.local_sgd_after) % options_.average_every == 0) {
      trace::scope s("average parameters", "communication", tracer_);
      average_parameters();
      result.averaged_parameters = true;
    }
  }

  static std::string name() { return std::string(Backend::trainer_name); }

  static constexpr bool supports_compression() {
    return Backend::compresses && collective<Collective, float16> && collective<Collective, bfloat16>;
  }

  bool local_sgd_now() const noexcept { return options_.average_every > 1 && steps_ >= options_.local_sgd_after; }

  // DDP's find_unused_parameters: what the model did not report gets a zero gradient, reported.
  template <class OnReady>
  void report_unused(OnReady& on_ready) {
    if constexpr (Backend::host_tensors) {
      if (!options_.find_unused_parameters) return;
      for (std::size_t t : readiness_->unreported()) {
        backend_.zero(model_.gradients(t));
        on_ready(t);
      }
    }
  }

  // Tensor i's share of the accumulated gradients.
  span accumulation(std::size_t i) {
    return span(accumulation_.data() + plan_.parameter_offset(i), model_.gradients(i).size());
  }

  // Every rank gathers every rank's plan and options, by name; all raise the same error.
  void check_plan_matches() {
    const auto fields = detail::agreed_fields(plan_, contiguous_, options_);
    const std::vector<std::int64_t> mine = dtrain::detail::values_of(fields);
    const auto all = backend_.allgather_digests(comm_, std::span<const std::int64_t>(mine));
    const std::string disagreement = dtrain::detail::field_disagreement(fields, all);
    if (disagreement.empty()) return;
    throw error(errc::invalid_argument, name() + ": ranks disagree on the model or trainer options: " + disagreement +
                                            ". Every rank must build the same model and pass the same trainer_options");
  }

  // Posts the ready buckets in plan order, except the last, which `step` reduces itself.
  void launch_ready_buckets() {
    while (const bucket* b = readiness_->take_complete()) post_bucket(*b, role::average_gradients);
  }

  void post_bucket(const bucket& b, role r) {
    if (comm_.size() == 1 && !Backend::mixed) return;  // nothing to average: no hand-off either
    worker_->post([this, &b, r] {
      trace::scope s(r == role::average_gradients ? "allreduce gradients" : "average parameters", "communication",
                     tracer_);
      run_bucket(b, r);
    });
  }

  span tensor(std::size_t i, role r) {
    return r == role::average_gradients ? model_.gradients(i) : model_.parameters(i);
  }

  // Runs on the communication thread (or the constructor's, or `step`'s once that one is idle).
  void run_bucket(const bucket& b, role r) {
    if constexpr (Backend::mixed) {  // into the float gradient, whatever the world size
      if (r == role::average_gradients) return backend_.average_gradients(comm_, b, model_);
    }
    if (comm_.size() == 1) return;  // the average of one replica is itself
    const bool compress = compressing(r);
    if (r != role::broadcast_parameters) bytes_reduced_ += payload_bytes(b, compress);
    if (r == role::average_gradients) backend_.await_gradients(b.tensors);
    if (!compress && contiguous_[index_of(b)]) {  // the bucket's tensors sit side by side: in place
      backend_.fence();  // the collective may run on a stream of its own: its input must be final
      collective_op(span(tensor(b.tensors.back(), r).data(), b.elements), r);
      return;
    }
    span flat = backend_.scratch(b.elements);
    for (std::size_t k = 0; k < b.tensors.size(); ++k) {
      span t = tensor(b.tensors[k], r);
      backend_.copy(flat.subspan(b.offsets[k], t.size()), t);
    }
    backend_.fence();
    if (compress) {
      if constexpr (supports_compression()) {
        if (options_.compress == compression::fp16) {
          backend_.template allreduce_compressed<float16>(comm_, flat);
        } else if (options_.compress == compression::bf16) {
          backend_.template allreduce_compressed<bfloat16>(comm_, flat);
        } else if constexpr (Backend::host_tensors) {
          backend_.allreduce_topk(comm_, flat, index_of(b), topk_count(b.elements, options_.topk_density));
        }
      }
    } else {
      collective_op(flat, r);
    }
    if (r == role::broadcast_parameters && comm_.rank() == options_.root) return;
    for (std::size_t k = 0; k < b.tensors.size(); ++k) {
      span t = tensor(b.tensors[k], r);
      backend_.copy(t, flat.subspan(b.offsets[k], t.size()));
    }
    backend_.fence();
  }

  std::size_t index_of(const bucket& b) const noexcept { return static_cast<std::size_t>(&b - plan_.buckets().data()); }

  // The bytes this rank hands the collective for bucket `b`'s gradients.
  std::size_t payload_bytes(const bucket& b, bool compress) const {
    if (!compress) return b.elements * sizeof(value_type);
    if (options_.compress == compression::topk)
      return topk_count(b.elements, options_.topk_density) * (4 + sizeof(value_type));
    return b.elements * 2;
  }

  bool compressing(role r) const noexcept {
    return r == role::average_gradients && options_.compress != compression::none;
  }

  void collective_op(span data, role r) {
    if (r == role::broadcast_parameters) {
      comm_.broadcast(data, options_.root);
    } else {
      comm_.allreduce(data, reduce_op::avg);
    }
  }

  Collective comm_;
  updater_type updater_;
  Model& model_;
  trainer_options options_;
  trace::recorder& tracer_;
  Backend backend_;
  loss_scaler scaler_;
  bucket_plan plan_;
  std::vector<bool> contiguous_;  // per bucket
  std::optional<detail::step_readiness> readiness_;  // refers to plan_
  std::size_t steps_ = 0;
  std::size_t accumulated_ = 0;             // batches `accumulate`d since the last step
  std::vector<value_type> accumulation_;    // their gradients' sum, laid out as the updater's state
  double inline_seconds_ = 0;  // buckets reduced by `step` itself
  std::uint64_t bytes_reduced_ = 0;  // written by the communication thread; read after drain
  trainer_stats stats_;
  bool broken_ = false;
  std::optional<dtrain::detail::comm_thread> worker_;  // last: destroyed (joined) first
};

}  // namespace dtrain::allreduce
