#pragma once
/// @file
/// `allreduce::trainer<Collective, Updater, Model>`: synchronous data-parallel training. Every
/// rank holds a full replica; each step its gradients are averaged across ranks, bucket by
/// bucket while the backward pass goes on, and every rank applies the same update.
///
/// @code
/// using comm_t = dtrain::ring<dtrain::tcp_transport>;
/// dtrain::allreduce::trainer trainer(comm_t(dtrain::tcp_transport::from_environment()),
///                                    dtrain::momentum<float>(0.05, 0.9), model);
/// for (auto& batch : my_shard) trainer.step(batch);
/// @endcode
///
/// What happens (docs/trainers.md has the details and the timeline):
///  - At construction rank `root`'s parameters are broadcast, and the bucket plan (tensor sizes,
///    bucket boundaries, options) is compared across ranks: a mismatch raises the same error on
///    every rank instead of a hang.
///  - In `step`, the model reports each gradient as final; once every tensor of the next bucket
///    (in plan order) is final, that bucket's allreduce is queued to the communication thread.
///    Buckets therefore go out in the same order on every rank, whatever the timing.
///  - fp16 / bf16 compression divides by the world size, reduces in half precision and widens
///    back (PyTorch's fp16_compress_hook), halving the bytes on the wire.
///  - Local SGD (`average_every = tau > 1`): each rank steps on its own gradients and the
///    parameters are averaged every tau steps; `local_sgd_after` runs synchronous steps first
///    (post-local SGD).

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "dtrain/allreduce/bucket_plan.hpp"
#include "dtrain/concepts/collective.hpp"
#include "dtrain/concepts/model.hpp"
#include "dtrain/concepts/updater.hpp"
#include "dtrain/core/element.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/reduce_op.hpp"
#include "dtrain/core/trace.hpp"
#include "dtrain/reduce/host.hpp"

namespace dtrain::allreduce {

/// Whether buckets travel in the model's precision or in 16 bits.
enum class compression { none, fp16, bf16 };

/// How a trainer buckets, compresses and synchronises. Identical on every rank (checked).
struct trainer_options {
  /// Capacity of the first bucket (the last layers' gradients, ready first). DDP: 1 MiB.
  std::size_t first_bucket_bytes = std::size_t{1} << 20;
  /// Capacity of the other buckets. DDP: 25 MiB.
  std::size_t bucket_bytes = std::size_t{25} << 20;
  /// Gradient compression on the wire; parameters are never compressed.
  compression compress = compression::none;
  /// Local SGD period tau: 1 averages gradients every step; tau > 1 lets every rank step on its
  /// own gradients and averages the parameters every tau steps.
  std::size_t average_every = 1;
  /// Post-local SGD: this many synchronous steps before local SGD starts.
  std::size_t local_sgd_after = 0;
  /// The learning rate for each step (e.g. an `lr_schedule`); empty leaves the updater's own.
  std::function<double(std::size_t step)> learning_rate;
  /// Launch buckets while the backward pass runs; off launches them after it (for comparison).
  bool overlap = true;
  /// The rank whose initial parameters every rank starts from.
  int root = 0;
  /// Where the timeline goes; null: `trace::recorder::global()` (enabled by DTRAIN_TRACE).
  trace::recorder* tracer = nullptr;
};

/// What one `step` did.
struct step_result {
  double loss = 0;                 ///< this rank's mean loss on its batch
  double learning_rate = 0;        ///< the rate the update used
  bool averaged_parameters = false;  ///< local SGD averaged the parameters after this step
};

/// Where a trainer's time went, summed over its steps (seconds), for reports and benchmarks.
struct trainer_stats {
  std::size_t steps = 0;
  double step_seconds = 0;     ///< whole steps
  double compute_seconds = 0;  ///< the model's forward and backward passes
  double wait_seconds = 0;     ///< waiting for communication after backward: the exposed part
  double update_seconds = 0;   ///< the updater, and local SGD's parameter averaging
  double comm_seconds = 0;     ///< time in collectives, overlapped or not
  std::uint64_t bytes_reduced = 0;  ///< bytes handed to allreduce on this rank
  /// Adds one step: forward and backward from t0, waiting from t1, the update from t2, done at t3.
  void add_step(std::chrono::steady_clock::time_point t0, std::chrono::steady_clock::time_point t1,
                std::chrono::steady_clock::time_point t2, std::chrono::steady_clock::time_point t3) {
    auto seconds = [](std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); };
    ++steps;
    step_seconds += seconds(t3 - t0);
    compute_seconds += seconds(t1 - t0);
    wait_seconds += seconds(t2 - t1);
    update_seconds += seconds(t3 - t2);
  }
  /// The share of a step spent waiting for communication.
  double communication_share() const noexcept { return step_seconds > 0 ? wait_seconds / step_seconds : 0; }
};

namespace detail {

/// What ranks compare at start-up: the plan's digest, its size, and a digest of what changes
/// the traffic: compression, local SGD, and which buckets are contiguous (those reduce in memory
/// order, the others in plan order). Equal on every rank, or the job is misbuilt.
using plan_digest = std::array<std::int64_t, 4>;

inline plan_digest digest_of(const bucket_plan& plan, const std::vector<bool>& contiguous, const trainer_options& o) {
  std::uint64_t contiguity = 0;
  for (bool c : contiguous) contiguity = contiguity * 3 + (c ? 1 : 2);
  const std::uint64_t options = (static_cast<std::uint64_t>(o.compress) ^ (contiguity << 2)) |
                                (static_cast<std::uint64_t>(o.average_every) << 8) |
                                (static_cast<std::uint64_t>(o.local_sgd_after) << 32);
  return {static_cast<std::int64_t>(plan.fingerprint()), static_cast<std::int64_t>(plan.tensor_count()),
          static_cast<std::int64_t>(plan.elements()), static_cast<std::int64_t>(options)};
}

/// Given every rank's digest (rank r at `all[4r, 4r + 4)`), "" if they agree, else the
/// message every rank raises, naming the first rank that differs from rank 0.
inline std::string plan_disagreement(std::span<const std::int64_t> all, const std::string& who) {
  auto describe = [](const std::int64_t* p) {
    return std::to_string(p[1]) + " tensors, " + std::to_string(p[2]) + " elements, plan digest " +
           std::to_string(static_cast<std::uint64_t>(p[0])) + ", options digest " + std::to_string(p[3]);
  };
  for (std::size_t r = 1; 4 * r < all.size(); ++r) {
    const std::int64_t* theirs = all.data() + 4 * r;
    if (std::equal(theirs, theirs + 4, all.data())) continue;
    return who + ": ranks disagree on the model or trainer options: rank 0 has " + describe(all.data()) + "; rank " +
           std::to_string(r) + " has " + describe(theirs) +
           ". Every rank must build the same model and pass the same trainer_options";
  }
  return {};
}

/// Runs jobs, in the order they were queued, on one thread that owns the collective.
class comm_thread {
 public:
  explicit comm_thread(trace::recorder& tracer) : tracer_(tracer), thread_([this] { run(); }) {}
  comm_thread(const comm_thread&) = delete;
  comm_thread& operator=(const comm_thread&) = delete;
  ~comm_thread() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

  void post(std::function<void()> job) {
    {
      std::lock_guard lock(mutex_);
      jobs_.push_back(std::move(job));
      ++posted_;
    }
    wake_.notify_all();
  }

  /// Waits until every posted job has run; rethrows the first failure (once).
  void drain() {
    std::unique_lock lock(mutex_);
    done_cv_.wait(lock, [&] { return finished_ == posted_; });
    if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
  }

  /// Seconds spent running jobs so far.
  double busy_seconds() const {
    std::lock_guard lock(mutex_);
    return busy_;
  }

 private:
  void run() {
    tracer_.name_thread("communication");
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      auto job = std::move(jobs_.front());
      jobs_.pop_front();
      const bool skip = failed_;  // after a failure the collective is broken: skip, finish fast
      lock.unlock();
      const auto t0 = std::chrono::steady_clock::now();
      std::exception_ptr e;
      if (!skip) {
        try {
          job();
        } catch (...) {
          e = std::current_exception();
        }
      }
      const auto t1 = std::chrono::steady_clock::now();
      lock.lock();
      busy_ += std::chrono::duration<double>(t1 - t0).count();
      if (e && !failed_) {
        failed_ = true;
        failure_ = e;
      }
      ++finished_;
      done_cv_.notify_all();
    }
  }

  mutable std::mutex mutex_;
  std::condition_variable wake_, done_cv_;
  std::deque<std::function<void()>> jobs_;
  std::uint64_t posted_ = 0, finished_ = 0;
  bool stop_ = false, failed_ = false;
  std::exception_ptr failure_;
  double busy_ = 0;
  trace::recorder& tracer_;
  std::thread thread_;  // last: starts once everything above exists
};

}  // namespace detail

/// Synchronous data-parallel training of `Model` over `Collective`, updated by `Updater`.
/// @tparam Collective a `collective` of the model's value type (ring<tcp_transport>, tuned<...>)
/// @tparam Updater an `updater` of the model's value type (sgd, momentum, adam, ...)
/// @tparam Model a `model`; the trainer keeps a reference, so it must outlive the trainer
/// Not thread-safe: one thread calls `step`. The collective belongs to the trainer's
/// communication thread; use `with_collective` to run other collectives in order with it.
template <class Collective, class Updater, model Model>
  requires collective<Collective, typename Model::value_type> && collective<Collective, std::int64_t> &&
           updater<Updater, typename Model::value_type>
class trainer {
 public:
  using value_type = typename Model::value_type;
  using batch_type = typename Model::batch_type;

  /// Broadcasts rank `options.root`'s parameters and checks that every rank planned the same
  /// buckets. Collective: every rank constructs its trainer.
  /// @throws dtrain::error `invalid_argument` (on every rank) if the ranks' models or options
  ///   differ, `unsupported` if compression is asked of a collective without 16-bit types, and
  ///   the collective's errors (timeout naming the missing rank, peer_lost, ...).
  trainer(Collective comm, Updater updater, Model& model, trainer_options options = {})
      : comm_(std::move(comm)),
        updater_(std::move(updater)),
        model_(model),
        options_(std::move(options)),
        tracer_(options_.tracer != nullptr ? *options_.tracer : trace::recorder::global()) {
    const std::vector<std::size_t> sizes = detail::tensor_sizes(model_, "allreduce::trainer");
    if (options_.average_every == 0) options_.average_every = 1;
    if (options_.root < 0 || options_.root >= comm_.size()) {
      throw error(errc::invalid_argument, "allreduce::trainer: root " + std::to_string(options_.root) +
                                              " is not a rank of this group of " + std::to_string(comm_.size()));
    }
    if (options_.compress != compression::none && !supports_compression()) {
      throw error(errc::unsupported, "allreduce::trainer: this collective has no 16-bit element types");
    }
    plan_ = bucket_plan(sizes, sizeof(value_type), options_.first_bucket_bytes, options_.bucket_bytes);
    contiguous_ = detail::contiguous_buckets(plan_, model_);
    check_plan_matches();
    scratch_.resize(plan_.largest_bucket());
    for (const bucket& b : plan_.buckets()) run_bucket(b, role::broadcast_parameters);
    if (updater_.parameters() < plan_.elements()) updater_.resize(plan_.elements());
    readiness_.emplace(plan_);
    tracer_.set_rank(comm_.rank());
    tracer_.name_thread("compute");
    worker_.emplace(tracer_);
  }

  trainer(const trainer&) = delete;
  trainer& operator=(const trainer&) = delete;

  /// Stops the communication thread after the jobs already queued.
  ~trainer() { tracer_.flush(); }

  /// One training step on this rank's `batch`: forward and backward, gradients averaged across
  /// ranks (or, under local SGD, parameters averaged every tau steps), one update.
  /// Collective: every rank calls `step` the same number of times.
  /// @throws dtrain::error the collective's errors; `invalid_argument` if the model reported a
  ///   tensor twice, one out of range, or not all of them. After an error the trainer is broken.
  step_result step(const batch_type& batch) {
    using clock = std::chrono::steady_clock;
    if (broken_) throw error(errc::broken, "allreduce::trainer: an earlier step failed; rebuild the trainer");
    trace::scope whole("step", "train", tracer_);
    const auto t0 = clock::now();
    step_result result;
    if (options_.learning_rate) updater_.set_learning_rate(options_.learning_rate(steps_));
    result.learning_rate = updater_.learning_rate();
    const bool sync = !local_sgd_now();

    readiness_->reset();
    auto on_ready = [&](std::size_t tensor) {
      if (readiness_->report(tensor) && sync && options_.overlap) launch_ready_buckets();
    };
    try {
      {
        trace::scope s("forward+backward", "compute", tracer_);
        result.loss = model_.forward_backward(batch, gradient_ready(on_ready));
      }
      const auto t1 = clock::now();
      const std::string misuse = readiness_->finish();
      {
        trace::scope s("wait for gradients", "communication", tracer_);
        worker_->drain();
        if (!misuse.empty()) throw error(errc::invalid_argument, "allreduce::trainer: " + misuse);
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
      const auto t2 = clock::now();
      {
        trace::scope s("update", "compute", tracer_);
        for (std::size_t i = 0; i < plan_.tensor_count(); ++i) {
          updater_.step(model_.parameters(i), std::span<const value_type>(model_.gradients(i)),
                        plan_.parameter_offset(i), {});
        }
      }
      ++steps_;
      if (!sync && (steps_ - options_.local_sgd_after) % options_.average_every == 0) {
        trace::scope s("average parameters", "communication", tracer_);
        average_parameters();
        result.averaged_parameters = true;
      }
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

  /// Averages the parameters across ranks now (the end of local SGD). Collective.
  void average_parameters() {
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

  /// Sums `values` across ranks, in place, in order with the buckets (see `with_collective`).
  template <class E>
  void sum_across_ranks(std::span<E> values) {
    with_collective([values](Collective& c) { c.allreduce(values, reduce_op::sum); });
  }

  int rank() const noexcept { return comm_.rank(); }
  int size() const noexcept { return comm_.size(); }
  std::size_t steps() const noexcept { return steps_; }
  const bucket_plan& plan() const noexcept { return plan_; }
  const trainer_options& options() const noexcept { return options_; }
  const trainer_stats& stats() const noexcept { return stats_; }
  Updater& updater() noexcept { return updater_; }

 private:
  enum class role { broadcast_parameters, average_gradients, average_parameters };

  static constexpr bool supports_compression() {
    return collective<Collective, float16> && collective<Collective, bfloat16>;
  }

  bool local_sgd_now() const noexcept { return options_.average_every > 1 && steps_ >= options_.local_sgd_after; }

  // Every rank gathers every rank's plan digest and option digest; all raise the same error.
  void check_plan_matches() {
    const auto mine = detail::digest_of(plan_, contiguous_, options_);
    std::vector<std::int64_t> all(4 * static_cast<std::size_t>(comm_.size()));
    comm_.allgather(std::span<const std::int64_t>(mine), std::span<std::int64_t>(all));
    const std::string disagreement = detail::plan_disagreement(all, "allreduce::trainer");
    if (!disagreement.empty()) throw error(errc::invalid_argument, disagreement);
  }

  // Posts the ready buckets in plan order, except the last, which `step` reduces itself.
  void launch_ready_buckets() {
    while (const bucket* b = readiness_->take_complete()) post_bucket(*b, role::average_gradients);
  }

  void post_bucket(const bucket& b, role r) {
    if (comm_.size() == 1) return;  // nothing to average: no hand-off to the other thread either
    worker_->post([this, &b, r] {
      trace::scope s(r == role::average_gradients ? "allreduce gradients" : "average parameters", "communication", tracer_);
      run_bucket(b, r);
    });
  }

  std::span<value_type> tensor(std::size_t i, role r) {
    return r == role::average_gradients ? model_.gradients(i) : model_.parameters(i);
  }

  // Runs on the communication thread (or the constructor's, before it exists).
  void run_bucket(const bucket& b, role r) {
    if (comm_.size() == 1) return;  // the average of one replica is itself
    if (r != role::broadcast_parameters) bytes_reduced_ += b.elements * (compressing(r) ? 2 : sizeof(value_type));
    const bool compress = compressing(r);
    if (!compress && contiguous_[index_of(b)]) {  // the bucket's tensors sit side by side: in place
      collective_op(contiguous_span(b, r), r);
      return;
    }
    std::span<value_type> flat(scratch_.data(), b.elements);
    for (std::size_t k = 0; k < b.tensors.size(); ++k) {
      auto t = tensor(b.tensors[k], r);
      std::copy(t.begin(), t.end(), flat.begin() + static_cast<std::ptrdiff_t>(b.offsets[k]));
    }
    if (compress) {
      if constexpr (supports_compression()) {
        if (options_.compress == compression::fp16) {
          reduce_compressed<float16>(flat);
        } else {
          reduce_compressed<bfloat16>(flat);
        }
      }
    } else {
      collective_op(flat, r);
    }
    if (r == role::broadcast_parameters && comm_.rank() == options_.root) return;
    for (std::size_t k = 0; k < b.tensors.size(); ++k) {
      auto t = tensor(b.tensors[k], r);
      auto from = flat.begin() + static_cast<std::ptrdiff_t>(b.offsets[k]);
      std::copy(from, from + static_cast<std::ptrdiff_t>(t.size()), t.begin());
    }
  }

  std::size_t index_of(const bucket& b) const noexcept {
    return static_cast<std::size_t>(&b - plan_.buckets().data());
  }

  std::span<value_type> contiguous_span(const bucket& b, role r) {
    return std::span<value_type>(tensor(b.tensors.back(), r).data(), b.elements);
  }

  bool compressing(role r) const noexcept {
    return r == role::average_gradients && options_.compress != compression::none;
  }

  void collective_op(std::span<value_type> data, role r) {
    if (r == role::broadcast_parameters) {
      comm_.broadcast(data, options_.root);
    } else {
      comm_.allreduce(data, reduce_op::avg);
    }
  }

  // Divide first, so the half-precision sum cannot overflow; then reduce 16-bit values.
  template <class Half>
  void reduce_compressed(std::span<value_type> flat) {
    auto& buffer = std::get<std::vector<Half>>(scratch16_);
    buffer.resize(flat.size());
    std::span<Half> packed(buffer);
    dtrain::detail::pack_scaled(flat.data(), packed.data(), flat.size(), 1.0f / static_cast<float>(comm_.size()));
    comm_.allreduce(packed, reduce_op::sum);
    dtrain::detail::unpack(packed.data(), flat.data(), flat.size());
  }

  Collective comm_;
  Updater updater_;
  Model& model_;
  trainer_options options_;
  trace::recorder& tracer_;
  bucket_plan plan_;
  std::vector<value_type> scratch_;
  std::tuple<std::vector<float16>, std::vector<bfloat16>> scratch16_;
  std::vector<bool> contiguous_;  // per bucket
  std::optional<detail::step_readiness> readiness_;  // refers to plan_
  std::size_t steps_ = 0;
  double inline_seconds_ = 0;  // buckets reduced by `step` itself
  std::uint64_t bytes_reduced_ = 0;  // written by the communication thread; read after drain
  trainer_stats stats_;
  bool broken_ = false;
  std::optional<detail::comm_thread> worker_;  // last: destroyed (joined) first
};

}  // namespace dtrain::allreduce
