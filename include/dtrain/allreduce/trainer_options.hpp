#pragma once
/// @file
/// What every allreduce trainer is told and reports: `trainer_options`, `step_result`,
/// `trainer_stats`, and the start-up check that every rank built the same plan with the same
/// options.

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "dtrain/allreduce/bucket_plan.hpp"
#include "dtrain/core/trace.hpp"
#include "dtrain/detail/agreed_fields.hpp"
#include "dtrain/transport/progress.hpp"
#include "dtrain/updater/loss_scaler.hpp"

namespace dtrain::allreduce {

/// Whether buckets travel in the model's precision, in 16 bits, or as their top-k entries.
enum class compression { none, fp16, bf16, topk };
inline constexpr const char* compression_names[] = {"none", "fp16", "bf16", "topk"};

/// `trainer_options::first_bucket_bytes`'s default: sized by `first_bucket_capacity`.
inline constexpr std::size_t automatic_first_bucket = 0;

/// The first bucket's capacity for `total_bytes` of gradients: `asked`, unless it is
/// `automatic_first_bucket`. Then DDP's 1 MiB, or where every rank has cores to spare (its
/// transport's `spare_cores()`, progress.hpp) an eighth of the gradients, kept within 64 KiB and
/// 1 MiB: a model under 1 MiB is then cut into two or more buckets, and its last layers' average
/// runs on the communication thread's core while the first layers' gradients are computed.
constexpr std::size_t first_bucket_capacity(std::size_t asked, std::size_t total_bytes, bool spare_cores) noexcept {
  constexpr std::size_t ddp = std::size_t{1} << 20, smallest = std::size_t{64} << 10;
  if (asked != automatic_first_bucket) return asked;
  return spare_cores ? std::clamp(total_bytes / 8, smallest, ddp) : ddp;
}

/// How a trainer buckets, compresses and synchronises. Identical on every rank (checked).
struct trainer_options {
  /// Capacity of the first bucket (the last layers' gradients, ready first): DDP's 1 MiB, or a
  /// smaller one where every rank has cores to spare (`first_bucket_capacity`).
  std::size_t first_bucket_bytes = automatic_first_bucket;
  /// Capacity of the other buckets. DDP: 25 MiB.
  std::size_t bucket_bytes = std::size_t{25} << 20;
  /// Gradient compression on the wire; parameters are never compressed.
  compression compress = compression::none;
  /// Under `compression::topk`: the share of each bucket's entries a rank sends (its largest
  /// after error feedback, as index and value pairs, allgathered); the rest carries over.
  double topk_density = 0.01;
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
  /// DDP's `find_unused_parameters`: a tensor the model does not report in a step (a branch it
  /// did not take) gets a zero gradient from the trainer and is averaged with the other ranks'
  /// (it is stepped, so momentum and Adam state move on; PyTorch skips tensors no rank used).
  /// Off, an unreported tensor is an error.
  bool find_unused_parameters = false;
  /// Clips the averaged gradient to this global L2 norm before the update (PyTorch's
  /// `clip_grad_norm_`: scale by max_norm / (norm + 1e-6) when that is below 1); 0 is off. The
  /// replicas hold the same averaged gradient, so the norm needs no communication.
  double clip_grad_norm = 0;
  /// A 16-bit model (mixed precision, mixed_backend.hpp): the precision its gradients are
  /// averaged in. A `float` or `double` model averages in its own type either way.
  reduce_precision reduce_in = reduce_precision::master;
  /// A 16-bit model: dynamic loss scaling (for float16); the model must have `set_loss_scale`.
  loss_scaling scaling;
  /// Where the timeline goes; null: `trace::recorder::global()` (enabled by DTRAIN_TRACE).
  trace::recorder* tracer = nullptr;
};

/// What one `step` did.
struct step_result {
  double loss = 0;                 ///< this rank's mean loss on its batch
  double learning_rate = 0;        ///< the rate the update used
  bool averaged_parameters = false;  ///< local SGD averaged the parameters after this step
  double grad_norm = 0;              ///< the gradient's L2 norm before clipping (when clipping)
  std::size_t batches = 1;           ///< batches the update averaged: 1 + those `accumulate`d
  double loss_scale = 1;             ///< the factor the step's loss was scaled by (1 without loss scaling)
  bool skipped = false;              ///< a gradient was inf or NaN on some rank: no parameter changed
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

/// Which buckets are contiguous (reduced in memory order) as one number, base 3.
inline std::uint64_t contiguity_of(const std::vector<bool>& contiguous) noexcept {
  std::uint64_t contiguity = 0;
  for (bool c : contiguous) contiguity = contiguity * 3 + (c ? 1 : 2);
  return contiguity;
}

/// The plan's digest, its size, and a digest of what changes the traffic: compression, local
/// SGD, mixed precision, and which buckets are contiguous (those reduce in memory order, the
/// others in plan order). A checkpoint records the last (`trainer_checkpoints.hpp`); the ranks
/// compare the same at start-up field by field (`agreed_fields`).
using plan_digest = std::array<std::int64_t, 4>;

inline plan_digest digest_of(const bucket_plan& plan, const std::vector<bool>& contiguous, const trainer_options& o) {
  const std::uint64_t contiguity = contiguity_of(contiguous);
  const std::uint64_t traffic = (static_cast<std::uint64_t>(o.compress) ^ (contiguity << 2)) |
                                (static_cast<std::uint64_t>(o.average_every) << 8) |
                                (static_cast<std::uint64_t>(o.local_sgd_after) << 32);
  const std::uint64_t options = traffic ^ (static_cast<std::uint64_t>(o.reduce_in) << 62) ^
                                (static_cast<std::uint64_t>(o.scaling.enabled) << 63);
  const std::uint64_t density = o.compress == compression::topk ? std::bit_cast<std::uint64_t>(o.topk_density) : 0;
  const loss_scaling& s = o.scaling;  // every rank must scale alike, or the average mixes scales
  const std::uint64_t scaling = s.enabled ? (std::bit_cast<std::uint64_t>(s.initial_scale) * 0xff51afd7ed558ccdull) ^
                                                std::bit_cast<std::uint64_t>(s.growth_factor * s.backoff_factor) ^
                                                (s.growth_interval * 0xc4ceb9fe1a85ec53ull)
                                          : 0;
  return {static_cast<std::int64_t>(plan.fingerprint()), static_cast<std::int64_t>(plan.tensor_count()),
          static_cast<std::int64_t>(plan.elements()),
          static_cast<std::int64_t>(options ^ (density * 0x9e3779b97f4a7c15ull) ^ scaling)};
}

/// Whether every rank's transport has two cores for each rank on its host (progress.hpp): the
/// automatic first bucket's question, asked of every rank alike whatever its options (one value
/// each, gathered through `backend`). A device model's kernels leave the cores free: no.
template <class Backend, class Collective>
bool every_rank_has_spare_cores(Backend& backend, Collective& comm) {
  if constexpr (!Backend::host_tensors) {
    return false;
  } else {
    if (comm.size() == 1) return false;
    std::int64_t mine = 0;
    if constexpr (requires { comm.transport(); }) mine = spare_cores_of(comm.transport()) ? 1 : 0;
    const auto all = backend.allgather_digests(comm, std::span<const std::int64_t>(&mine, 1));
    return std::all_of(all.begin(), all.end(), [](std::int64_t v) { return v == 1; });
  }
}

/// What ranks compare at start-up, by name: the plan and every option that changes the traffic
/// or the arithmetic (those `digest_of` folds into its digest for checkpoints).
inline std::vector<dtrain::detail::agreed_field> agreed_fields(const bucket_plan& plan,
                                                               const std::vector<bool>& contiguous,
                                                               const trainer_options& o) {
  using field = dtrain::detail::agreed_field;
  const std::uint64_t contiguity = contiguity_of(contiguous);
  const loss_scaling& s = o.scaling;
  return {field::count("tensors", plan.tensor_count()),
          field::count("elements", plan.elements()),
          field::digest("the tensors' sizes or their buckets (first_bucket_bytes, bucket_bytes)", plan.fingerprint()),
          field::digest("which buckets lie contiguous in memory", contiguity),
          field::choice("compress", o.compress, compression_names),
          field::real("topk_density", o.compress == compression::topk ? o.topk_density : 0),
          field::count("average_every", o.average_every),
          field::count("local_sgd_after", o.local_sgd_after),
          field::choice("reduce_in", o.reduce_in, reduce_precision_names),
          field::flag("scaling.enabled", s.enabled),
          field::real("scaling.initial_scale", s.enabled ? s.initial_scale : 0),
          field::real("scaling.growth_factor", s.enabled ? s.growth_factor : 0),
          field::real("scaling.backoff_factor", s.enabled ? s.backoff_factor : 0),
          field::count("scaling.growth_interval", s.enabled ? s.growth_interval : 0)};
}


}  // namespace detail

}  // namespace dtrain::allreduce
