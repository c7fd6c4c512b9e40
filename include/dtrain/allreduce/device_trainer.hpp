#pragma once
/// @file
/// `allreduce::device_trainer<Collective, Updater, Model>`: the allreduce trainer for models whose
/// parameters and gradients live where Thrust's device system runs: GPU memory in a CUDA build
/// (NCCL, or device buffers staged over TCP), host memory under Thrust's CPP and OMP systems
/// (the same code, tested on machines without a GPU). Link `dtrain::thrust` (and `dtrain::cuda`
/// in a CUDA build, compiled by nvcc).
///
/// @code
/// using comm_t = dtrain::nccl_communicator;            // or staged_communicator<tcp_transport>
/// dtrain::allreduce::device_trainer trainer(std::move(comm), dtrain::momentum<float>(0.05, 0.9), model);
/// for (auto& batch : my_shard) trainer.step(batch);
/// @endcode
///
/// Streams and events (docs/gpu.md has the timeline):
///  - The model enqueues its forward and backward kernels on its stream and calls `ready(i)` as
///    soon as the kernels that write gradient i are enqueued. The trainer records an event there.
///  - A complete bucket goes to the communication thread, which makes its own stream wait for
///    the bucket's events, packs the gradients into a device bucket buffer (unless they are
///    adjacent in memory), and runs the collective: NCCL kernels, or staging and a Thrust
///    reduction, on streams of their own. Backward kernels keep running meanwhile.
///  - After the last bucket the update is enqueued on the model's stream with the updater's own
///    per-element rule (`device_updater`), so the next forward pass is ordered after it.
/// What `trainer` offers (bucket plan, checks across ranks, local SGD, lr schedules, stats) works
/// the same; 16-bit compression does not exist on the device yet and is refused.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/allreduce/bucket_plan.hpp"
#include "dtrain/allreduce/trainer.hpp"
#include "dtrain/concepts/collective.hpp"
#include "dtrain/concepts/device_model.hpp"
#include "dtrain/concepts/model.hpp"
#include "dtrain/concepts/updater.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/reduce_op.hpp"
#include "dtrain/core/trace.hpp"
#include "dtrain/reduce/thrust_space.hpp"
#include "dtrain/reduce/thrust.hpp"
#include "dtrain/updater/device.hpp"

namespace dtrain {

/// A `device_tensor_model` (concepts/device_model.hpp) over this build's Thrust device memory:
/// tensors are `thrust_buffer<value_type>` (a `device_span` in a CUDA build) and `stream()` is a
/// `cudaStream_t` (on the CPU, a tag).
template <class M>
concept device_model = device_tensor_model<M, thrust_buffer, detail::thrust_space::stream_handle>;

}  // namespace dtrain

namespace dtrain::allreduce {

namespace detail {
namespace thrust_space = dtrain::detail::thrust_space;
}  // namespace detail

/// Synchronous data-parallel training of a `device_model` over a collective of device buffers.
/// @tparam Collective a collective whose memory space is Thrust's device memory
///   (`nccl_communicator`, `staged_communicator<tcp_transport>`)
/// @tparam Updater a host updater type (sgd, momentum, adam, ...); its rule runs on the device
/// @tparam Model a `device_model`; the trainer keeps a reference
/// Not thread-safe: one thread calls `step`.
template <class Collective, class Updater, device_model Model>
  requires collective<Collective, typename Model::value_type> && collective<Collective, std::int64_t> &&
           std::same_as<typename Collective::memory_space, thrust_device_memory> &&
           updater<Updater, typename Model::value_type>
class device_trainer {
 public:
  using value_type = typename Model::value_type;
  using batch_type = typename Model::batch_type;

  /// Broadcasts rank `options.root`'s parameters and checks that every rank planned the same
  /// buckets. Collective: every rank constructs its trainer.
  /// @throws dtrain::error `invalid_argument` (on every rank) if the ranks' models or options
  ///   differ, `unsupported` if compression is asked for, and the collective's errors.
  device_trainer(Collective comm, Updater updater, Model& model, trainer_options options = {})
      : comm_(std::move(comm)),
        updater_(std::move(updater)),
        model_(model),
        options_(std::move(options)),
        tracer_(options_.tracer != nullptr ? *options_.tracer : trace::recorder::global()) {
    const std::vector<std::size_t> sizes = detail::tensor_sizes(model_, "allreduce::device_trainer");
    if (options_.average_every == 0) options_.average_every = 1;
    if (options_.root < 0 || options_.root >= comm_.size()) {
      throw error(errc::invalid_argument, "allreduce::device_trainer: root " + std::to_string(options_.root) +
                                              " is not a rank of this group of " + std::to_string(comm_.size()));
    }
    if (options_.compress != compression::none) {
      throw error(errc::unsupported,
                  "allreduce::device_trainer: 16-bit compression is not implemented on the device; "
                  "use compression::none (NCCL's bandwidth makes it rarely worth it)");
    }
    plan_ = bucket_plan(sizes, sizeof(value_type), options_.first_bucket_bytes, options_.bucket_bytes);
    contiguous_ = detail::contiguous_buckets(plan_, model_);
    ready_events_.resize(plan_.tensor_count());
    scratch_ = detail::thrust_space::buffer<value_type>(plan_.largest_bucket());
    check_plan_matches();
    // The model may still be initialising its parameters on its stream.
    detail::thrust_space::synchronize(model_.stream());
    for (const bucket& b : plan_.buckets()) run_bucket(b, role::broadcast_parameters);
    updater_.resize(plan_.elements(), model_.stream());
    readiness_.emplace(plan_);
    tracer_.set_rank(comm_.rank());
    tracer_.name_thread("compute");
    worker_.emplace(tracer_);
  }

  device_trainer(const device_trainer&) = delete;
  device_trainer& operator=(const device_trainer&) = delete;
  ~device_trainer() { tracer_.flush(); }

  /// One training step on this rank's `batch` (see `trainer::step`). When it returns, the
  /// update is enqueued on the model's stream (not necessarily finished).
  step_result step(const batch_type& batch) {
    using clock = std::chrono::steady_clock;
    if (broken_) throw error(errc::broken, "allreduce::device_trainer: an earlier step failed; rebuild the trainer");
    trace::scope whole("step", "train", tracer_);
    const auto t0 = clock::now();
    step_result result;
    if (options_.learning_rate) updater_.set_learning_rate(options_.learning_rate(steps_));
    result.learning_rate = updater_.learning_rate();
    const bool sync = !local_sgd_now();

    readiness_->reset();
    auto on_ready = [&](std::size_t tensor) {
      if (!readiness_->report(tensor)) return;
      if (!sync) return;
      ready_events_[tensor].record(model_.stream());
      if (options_.overlap) {
        while (const bucket* b = readiness_->take_complete()) post_bucket(*b, role::average_gradients);
      }
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
        if (!misuse.empty()) throw error(errc::invalid_argument, "allreduce::device_trainer: " + misuse);
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
          updater_.step(model_.parameters(i), thrust_buffer<const value_type>(model_.gradients(i)),
                        plan_.parameter_offset(i), {}, model_.stream());
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
        worker_->drain();
      } catch (...) {
      }
      throw;
    }
    return result;
  }

  /// Averages the parameters across ranks now (after the updates enqueued so far). Collective.
  void average_parameters() {
    detail::thrust_space::synchronize(model_.stream());
    for (const bucket& b : plan_.buckets()) post_bucket(b, role::average_parameters);
    worker_->drain();
  }

  /// Runs `f(collective)` on the communication thread, in order with the buckets, and waits.
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
  device_updater<Updater>& updater() noexcept { return updater_; }

 private:
  enum class role { broadcast_parameters, average_gradients, average_parameters };

  bool local_sgd_now() const noexcept { return options_.average_every > 1 && steps_ >= options_.local_sgd_after; }

  // Every rank gathers every rank's plan digest (through device memory: the collective takes no
  // other); all raise the same error on a mismatch.
  void check_plan_matches() {
    const auto mine = detail::digest_of(plan_, contiguous_, options_);
    const auto n = static_cast<std::size_t>(comm_.size());
    detail::thrust_space::buffer<std::int64_t> in(mine.size()), out(mine.size() * n);
    detail::thrust_space::upload<std::int64_t>(in.span(), mine, comm_stream_.get());
    comm_.allgather(thrust_buffer<const std::int64_t>(in.span()), out.span());
    std::vector<std::int64_t> all(mine.size() * n);
    detail::thrust_space::download<std::int64_t>(all, out.span(), comm_stream_.get());
    const std::string disagreement = detail::plan_disagreement(all, "allreduce::device_trainer");
    if (!disagreement.empty()) throw error(errc::invalid_argument, disagreement);
  }

  void post_bucket(const bucket& b, role r) {
    if (comm_.size() == 1) return;
    worker_->post([this, &b, r] {
      trace::scope s(r == role::average_gradients ? "allreduce gradients" : "average parameters", "communication", tracer_);
      run_bucket(b, r);
    });
  }

  thrust_buffer<value_type> tensor(std::size_t i, role r) {
    return r == role::average_gradients ? model_.gradients(i) : model_.parameters(i);
  }

  // Runs on the communication thread (or the constructor's, or `step`'s once it is idle).
  void run_bucket(const bucket& b, role r) {
    if (comm_.size() == 1) return;
    const auto s = comm_stream_.get();
    if (r == role::average_gradients) {
      bytes_reduced_ += b.elements * sizeof(value_type);
      for (std::size_t t : b.tensors) ready_events_[t].make_wait(s);
    }
    if (contiguous_[index_of(b)]) {
      // The collective runs on its own stream: the gradients must be final before it starts.
      detail::thrust_space::synchronize(s);
      collective_op(thrust_buffer<value_type>(tensor(b.tensors.back(), r).data(), b.elements), r);
      return;
    }
    auto flat = scratch_.span().first(b.elements);
    for (std::size_t k = 0; k < b.tensors.size(); ++k) {
      auto t = tensor(b.tensors[k], r);
      detail::thrust_space::copy<value_type>(flat.subspan(b.offsets[k], t.size()), t, s);
    }
    detail::thrust_space::synchronize(s);
    collective_op(flat, r);
    if (r == role::broadcast_parameters && comm_.rank() == options_.root) return;
    for (std::size_t k = 0; k < b.tensors.size(); ++k) {
      auto t = tensor(b.tensors[k], r);
      detail::thrust_space::copy<value_type>(t, flat.subspan(b.offsets[k], t.size()), s);
    }
    detail::thrust_space::synchronize(s);
  }

  void collective_op(thrust_buffer<value_type> data, role r) {
    if (r == role::broadcast_parameters) {
      comm_.broadcast(data, options_.root);
    } else {
      comm_.allreduce(data, reduce_op::avg);
    }
  }

  std::size_t index_of(const bucket& b) const noexcept { return static_cast<std::size_t>(&b - plan_.buckets().data()); }

  Collective comm_;
  device_updater<Updater> updater_;
  Model& model_;
  trainer_options options_;
  trace::recorder& tracer_;
  bucket_plan plan_;
  detail::thrust_space::owned_stream comm_stream_;
  std::vector<detail::thrust_space::event> ready_events_;  // per tensor, recorded on the model's stream
  detail::thrust_space::buffer<value_type> scratch_;
  std::vector<bool> contiguous_;
  std::optional<detail::step_readiness> readiness_;
  std::size_t steps_ = 0;
  double inline_seconds_ = 0;
  std::uint64_t bytes_reduced_ = 0;
  trainer_stats stats_;
  bool broken_ = false;
  std::optional<detail::comm_thread> worker_;  // last: destroyed (joined) first
};

}  // namespace dtrain::allreduce
