#pragma once
// Serial references for the pipeline trainers, written without any of the pipeline code: mini-batch
// training with gradient accumulation over the same micro-batches, and PipeDream's
// weight-stashing equations run one micro-batch at a time; plus the helpers a pipeline test rank
// uses to build its chunks of the same network.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "dtrain/concepts/updater.hpp"
#include "dtrain/pipeline/partition.hpp"
#include "mlp_stage.hpp"

namespace dtrain::testing {

/// The network every pipeline test trains: 8 layers, so up to 8 stages hold one each.
inline std::vector<int> test_widths() { return {5, 8, 7, 6, 8, 5, 7, 6, 3}; }
inline constexpr int test_batch = 3;

/// All of a stage's parameters, flattened in tensor order.
template <class Stage>
std::vector<typename Stage::value_type> flat_parameters(Stage& s) {
  std::vector<typename Stage::value_type> out;
  for (std::size_t i = 0; i < s.tensor_count(); ++i) {
    auto p = s.parameters(i);
    out.insert(out.end(), p.begin(), p.end());
  }
  return out;
}

/// Tensor i of a stage's parameters as raw bytes, appended to `out`: replicas compare these, so
/// that -0.0 against 0.0 or two NaNs differ as they would in a checkpoint.
template <class Stage>
void append_bytes(Stage& s, std::size_t i, std::vector<std::byte>& out) {
  const auto b = std::as_bytes(s.parameters(i));
  out.insert(out.end(), b.begin(), b.end());
}

template <class Stage>
void set_flat_parameters(Stage& s, const std::vector<typename Stage::value_type>& from) {
  std::size_t at = 0;
  for (std::size_t i = 0; i < s.tensor_count(); ++i) {
    for (auto& x : s.parameters(i)) x = from[at++];
  }
}

/// Applies update number `step` (1-based) to every tensor of `s` from its gradients, then zeroes
/// them.
template <class Stage, class Updater>
void update_and_zero(Stage& s, Updater& u, double scale, std::uint64_t step) {
  std::size_t offset = 0;
  for (std::size_t i = 0; i < s.tensor_count(); ++i) {
    auto g = s.gradients(i);
    for (auto& x : g) x *= static_cast<typename Stage::value_type>(scale);
    step_info info;
    info.step = step;
    u.step(s.parameters(i), std::span<const typename Stage::value_type>(g), offset, info);
    offset += g.size();
    std::fill(g.begin(), g.end(), typename Stage::value_type(0));
  }
}

/// The whole network trained serially: `steps` steps of `micro_batches` micro-batches each,
/// gradients accumulated in micro-batch order, scaled by 1 / micro_batches, one update a step.
/// @returns the parameters of layers [bounds[s], bounds[s + 1]) for each stage s.
template <class Updater>
std::vector<std::vector<double>> serial_accumulation(const pipeline::partition& bounds, int micro_batches, int steps,
                                                     Updater u) {
  const auto widths = test_widths();
  mlp_stage<double> whole(widths, 0, static_cast<int>(widths.size()) - 1, test_batch);
  std::size_t n = 0;
  for (std::size_t i = 0; i < whole.tensor_count(); ++i) n += whole.parameters(i).size();
  u.resize(n);
  for (int step = 0; step < steps; ++step) {
    for (int i = 0; i < micro_batches; ++i) {
      const micro_batch mb{static_cast<std::uint64_t>(step), i, micro_batches};
      whole.forward(mb, {}, {});
      whole.backward(mb, {}, {});
    }
    update_and_zero(whole, u, 1.0 / micro_batches, static_cast<std::uint64_t>(step + 1));
  }
  // Cut the whole network's parameters at the stage boundaries (two tensors per layer).
  std::vector<std::vector<double>> per_stage;
  for (std::size_t s = 0; s + 1 < bounds.size(); ++s) {
    std::vector<double> p;
    for (int t = 2 * bounds[s]; t < 2 * bounds[s + 1]; ++t) {
      auto x = whole.parameters(static_cast<std::size_t>(t));
      p.insert(p.end(), x.begin(), x.end());
    }
    per_stage.push_back(std::move(p));
  }
  return per_stage;
}

/// PipeDream's equations on p stages (one per rank), serially: within a step, micro-batch i runs
/// forward and backward on stage s with the weights after max(0, i - (p - 1 - s)) of the step's
/// updates of that stage, and each micro-batch's gradient (averaged over `replicas` replicas,
/// each with its own micro-batch i) is one update, applied in order.
template <class Updater>
std::vector<std::vector<double>> serial_pipedream(const pipeline::partition& bounds, int micro_batches, int steps,
                                                  const Updater& prototype, int replicas = 1) {
  const auto widths = test_widths();
  const int p = static_cast<int>(bounds.size()) - 1;
  std::vector<std::vector<mlp_stage<double>>> stages(static_cast<std::size_t>(replicas));  // [replica][stage]
  std::vector<Updater> updaters(static_cast<std::size_t>(p), prototype);
  for (int rr = 0; rr < replicas; ++rr) {
    for (int s = 0; s < p; ++s) stages[rr].emplace_back(widths, bounds[s], bounds[s + 1], test_batch, rr, replicas);
  }
  for (int s = 0; s < p; ++s) updaters[s].resize(flat_parameters(stages[0][s]).size());
  for (int step = 0; step < steps; ++step) {
    std::vector<std::vector<std::vector<double>>> versions(static_cast<std::size_t>(p));  // [stage][update]
    for (int s = 0; s < p; ++s) versions[s].push_back(flat_parameters(stages[0][s]));
    for (int i = 0; i < micro_batches; ++i) {
      const micro_batch mb{static_cast<std::uint64_t>(step), i, micro_batches};
      for (auto& replica : stages) {
        for (int s = 0; s < p; ++s) set_flat_parameters(replica[s], versions[s][std::max(0, i - (p - 1 - s))]);
        std::vector<std::vector<double>> acts(static_cast<std::size_t>(p + 1));
        for (int s = 0; s < p; ++s) {
          acts[s + 1].resize(replica[s].output_size());
          replica[s].forward(mb, acts[s], acts[s + 1]);
        }
        std::vector<double> grad;
        for (int s = p; s-- > 0;) {
          std::vector<double> in_grad(replica[s].input_size());
          replica[s].backward(mb, grad, in_grad);
          grad = std::move(in_grad);
        }
      }
      for (int s = 0; s < p; ++s) {
        for (std::size_t t = 0; t < stages[0][s].tensor_count(); ++t) {  // replica 0 holds the mean
          auto g0 = stages[0][s].gradients(t);
          for (int rr = 1; rr < replicas; ++rr) {
            auto g = stages[rr][s].gradients(t);
            for (std::size_t k = 0; k < g.size(); ++k) g0[k] += g[k], g[k] = 0;
          }
          for (auto& x : g0) x /= replicas;
        }
        set_flat_parameters(stages[0][s], versions[s].back());
        update_and_zero(stages[0][s], updaters[s], 1.0, static_cast<std::uint64_t>(step * micro_batches + i + 1));
        versions[s].push_back(flat_parameters(stages[0][s]));
      }
    }
  }
  std::vector<std::vector<double>> out;
  for (auto& s : stages[0]) out.push_back(flat_parameters(s));
  return out;
}

}  // namespace dtrain::testing
