#pragma once
/// @file
/// Pipeline schedules as data: for each rank, the plain sequence of actions (receive, forward,
/// send, backward, optimizer step) it runs in one trainer step. One executor runs every schedule
/// (`pipeline/executor.hpp`), and `pipeline/simulate.hpp` runs all ranks' sequences serially to
/// prove a schedule cannot deadlock, as PyTorch's `torch.distributed.pipelining` does.
///
/// A model of S stages runs on p ranks with v chunks each (S = p * v): rank r holds the stages
/// r, r + p, ..., r + (v - 1) p (Megatron's interleaving; v = 1 is a plain pipeline). Activations
/// go from stage s to s + 1 on rank (s + 1) mod p; gradients go back.
///
/// | schedule                  | bubble (idle fraction of a step) | peak live micro-batches per rank |
/// |---------------------------|----------------------------------|----------------------------------|
/// | `gpipe`                   | (p - 1) / (m + p - 1)            | m (only inputs with rematerialise)|
/// | `one_f_one_b`             | (p - 1) / (m + p - 1)            | min(p - r, m)                    |
/// | `interleaved_one_f_one_b` | (p - 1) / (v m + p - 1)          | min(2 (p - r - 1) + (v - 1) p + 1, v m) chunk
/// activations | | `pipedream`               | none in steady state (no flush)  | min(p - r, m), plus one weight
/// version each | with forward and backward of equal cost per stage; `pipeline/simulate.hpp` gives the exact figures of
/// any schedule and cost ratio.

#include <algorithm>
#include <string_view>
#include <vector>

#include "dtrain/pipeline/action.hpp"
#include "dtrain/pipeline/simulate.hpp"

namespace dtrain::pipeline {

namespace detail {

/// One compute action in a rank's order, before communication is added around it.
struct compute {
  bool forward;
  int mb;
  int chunk;
};

/// Surrounds each compute with the receive before it and the send after it that its stage needs:
/// no activation into stage 0 or out of the last stage, no gradient the other way.
inline std::vector<action> with_messages(const std::vector<compute>& order, int rank, const pipeline_shape& shape,
                                         bool step_after_each_backward) {
  std::vector<action> out;
  const int last = shape.stages() - 1;
  for (const compute& c : order) {
    const int s = shape.stage_of(rank, c.chunk);
    if (c.forward) {
      if (s > 0) out.push_back({action_kind::recv_activation, c.mb, c.chunk});
      out.push_back({action_kind::forward, c.mb, c.chunk});
      if (s < last) out.push_back({action_kind::send_activation, c.mb, c.chunk});
    } else {
      if (s < last) out.push_back({action_kind::recv_gradient, c.mb, c.chunk});
      out.push_back({action_kind::backward, c.mb, c.chunk});
      if (s > 0) out.push_back({action_kind::send_gradient, c.mb, c.chunk});
      if (step_after_each_backward) out.push_back({action_kind::optimizer_step, c.mb, 0});
    }
  }
  if (!step_after_each_backward) out.push_back({action_kind::optimizer_step, shape.micro_batches - 1, 0});
  return out;
}

/// Warm-up forwards, then one forward and one backward in turn, then the remaining backwards.
inline std::vector<compute> one_forward_one_backward(const std::vector<compute>& forwards,
                                                     const std::vector<compute>& backwards, int warmup) {
  std::vector<compute> order;
  const int total = static_cast<int>(forwards.size());
  warmup = std::clamp(warmup, 0, total);
  for (int i = 0; i < warmup; ++i) order.push_back(forwards[i]);
  for (int i = warmup; i < total; ++i) {
    order.push_back(forwards[i]);
    order.push_back(backwards[i - warmup]);
  }
  for (int i = total - warmup; i < total; ++i) order.push_back(backwards[i]);
  return order;
}

/// Micro-batches 0..m-1 on chunk 0, forward or backward.
inline std::vector<compute> in_order(int m, bool forward) {
  std::vector<compute> v;
  for (int i = 0; i < m; ++i) v.push_back({forward, i, 0});
  return v;
}

/// 1F1B's order on one chunk: p - r - 1 warm-up forwards, then in turn, then the rest.
inline std::vector<compute> one_f_one_b_order(int rank, const pipeline_shape& shape) {
  return one_forward_one_backward(in_order(shape.micro_batches, true), in_order(shape.micro_batches, false),
                                  shape.ranks - rank - 1);
}

}  // namespace detail

/// GPipe: every forward, then every backward, then one optimizer step (a flush). With
/// `rematerialise`, a stage keeps only its inputs between forward and backward and runs the
/// forward again just before each backward (GPipe's re-materialisation: less memory, one more
/// forward per micro-batch).
struct gpipe {
  static constexpr std::string_view name = "gpipe";
  bool rematerialise = false;
  int chunks() const noexcept { return 1; }
  std::vector<action> actions(int rank, const pipeline_shape& shape) const {
    std::vector<detail::compute> order = detail::in_order(shape.micro_batches, true);
    for (const detail::compute& b : detail::in_order(shape.micro_batches, false)) order.push_back(b);
    return detail::with_messages(order, rank, shape, false);
  }
};

/// 1F1B with a flush (PipeDream-Flush, Megatron's default): rank r runs p - r - 1 warm-up
/// forwards, then one forward and one backward in turn, then the remaining backwards, then one
/// optimizer step. Same bubble as GPipe; at most p - r micro-batches live on rank r.
struct one_f_one_b {
  static constexpr std::string_view name = "one_f_one_b";
  int chunks() const noexcept { return 1; }
  std::vector<action> actions(int rank, const pipeline_shape& shape) const {
    return detail::with_messages(detail::one_f_one_b_order(rank, shape), rank, shape, false);
  }
};

/// Megatron's interleaved 1F1B: each rank holds `v` chunks (stages r, r + p, ...), so a
/// micro-batch passes each rank v times and the bubble shrinks v-fold, for v times the
/// messages. Micro-batches go in groups of p (the last group may be smaller): a group runs
/// forward through chunk 0, then chunk 1, ...; backward through the chunks in reverse.
/// Warm-up on rank r: 2 (p - r - 1) + (v - 1) p forwards, Megatron's, when p divides m. When it
/// does not, the smaller last group can deadlock that count, so `warmups` raises the warm-up of
/// the ranks a simulated step finds waiting on a gradient until the step is sound (all forwards
/// first always is).
struct interleaved_one_f_one_b {
  static constexpr std::string_view name = "interleaved_one_f_one_b";
  int v = 2;
  int chunks() const noexcept { return v; }
  std::vector<action> actions(int rank, const pipeline_shape& shape) const {
    return actions(rank, shape, warmups(shape.ranks, shape.micro_batches)[rank]);
  }
  /// Forwards each rank runs before its first backward, for p ranks and m micro-batches.
  std::vector<int> warmups(int p, int m) const {
    std::vector<int> warmup;
    for (int r = 0; r < p; ++r) warmup.push_back(std::min(2 * (p - r - 1) + (v - 1) * std::min(p, m), v * m));
    const pipeline_shape shape{p, v, m};
    for (bool raised = true; raised;) {
      std::vector<std::vector<action>> plan;
      for (int r = 0; r < p; ++r) plan.push_back(actions(r, shape, warmup[r]));
      const simulation sim = simulate(plan, shape);
      if (sim.ok()) break;
      raised = false;
      for (int r = 0; r < p && !sim.stopped_at.empty(); ++r) {
        const std::size_t at = sim.stopped_at[r];
        if (at < plan[r].size() && plan[r][at].kind == action_kind::recv_gradient && warmup[r] < v * m) {
          ++warmup[r];
          raised = true;
        }
      }
    }
    return warmup;
  }

 private:
  std::vector<action> actions(int rank, const pipeline_shape& shape, int warmup) const {
    const int p = shape.ranks, m = shape.micro_batches;
    std::vector<detail::compute> forwards, backwards;
    for (int first = 0; first < m; first += p) {
      const int last = std::min(first + p, m);
      for (int c = 0; c < v; ++c) {
        for (int i = first; i < last; ++i) forwards.push_back({true, i, c});
      }
      for (int c = v; c-- > 0;) {
        for (int i = first; i < last; ++i) backwards.push_back({false, i, c});
      }
    }
    return detail::with_messages(detail::one_forward_one_backward(forwards, backwards, warmup), rank, shape, false);
  }
};

/// PipeDream (asynchronous 1F1B, no flush): the 1F1B order with an optimizer step after every
/// backward, so the pipeline never drains to update. With weight stashing (the executor's job
/// under this schedule) a micro-batch's backward on stage s uses the weights its forward used,
/// which are p - 1 - s updates old: PipeDream's
///   w(t + 1) = w(t) - lr * grad f(w_0^(t - p + 1), ..., w_(p-1)^(t)).
/// `vertical_sync` is not implemented: each stage uses its own latest weights.
struct pipedream {
  static constexpr std::string_view name = "pipedream";
  int chunks() const noexcept { return 1; }
  std::vector<action> actions(int rank, const pipeline_shape& shape) const {
    return detail::with_messages(detail::one_f_one_b_order(rank, shape), rank, shape, true);
  }
};

/// The idle fraction of a flushed pipeline step when forward and backward cost the same on
/// every stage: (p - 1) / (v m + p - 1) (GPipe and 1F1B: v = 1; Megatron's interleaving: v).
constexpr double bubble_fraction(int p, int m, int v = 1) noexcept {
  return static_cast<double>(p - 1) / (static_cast<double>(v) * m + p - 1);
}

}  // namespace dtrain::pipeline
