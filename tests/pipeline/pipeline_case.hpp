#pragma once
// One rank of a pipeline exactness case, shared by the in-process tests and the TCP worker: trains
// this rank's chunks of the test network under a schedule and compares every parameter with
// the serial reference (bit for bit for the flushed schedules and PipeDream; the replicas'
// average sums in another order, so within a relative 1e-12 there).

#include <cmath>
#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtrain/pipeline/trainer.hpp"
#include "reference.hpp"

namespace dtrain::testing {

struct case_result {
  int wrong = 0;        // parameters that differ from the reference
  std::string first;    // the first of them, described
  int peak_live = 0;    // the executor's peak over the steps
  std::vector<std::byte> bits;  // every chunk's parameters, raw: replicas must hold the same
};

/// Trains this rank's chunks (`pipeline` is the pipeline group; `replicas` averages over the
/// data-parallel group, `replica` of `replicas.size()`) for `steps` steps of `m` micro-batches,
/// then compares with the serial reference. Every rank of every replica runs this at once.
template <class Schedule, class Updater, class Transport, class Replicas = pipeline::single_replica>
case_result run_pipeline_case(Transport pipeline, const Schedule& schedule, const Updater& updater, int m, int steps,
                              Replicas replicas = {}, int replica = 0, bool overlap = true) {
  const int p = pipeline.size(), r = pipeline.rank(), v = schedule.chunks();
  const int dp = replicas.size();
  const auto widths = test_widths();
  const pipeline::partition bounds = pipeline::uniform_partition(widths.size() - 1, p * v);
  std::vector<mlp_stage<double>> chunks;
  for (int c = 0; c < v; ++c) {
    const int s = c * p + r;
    chunks.emplace_back(widths, bounds[s], bounds[s + 1], test_batch, replica, dp);
  }
  pipeline::trainer_options o;
  o.micro_batches = m;
  o.overlap = overlap;
  o.bucket_bytes = 256;  // several buckets per chunk
  pipeline::trainer<Transport, Schedule, Updater, mlp_stage<double>, Replicas> t(
      std::move(pipeline), std::move(chunks), updater, schedule, o, std::move(replicas));
  case_result result;
  for (int i = 0; i < steps; ++i) result.peak_live = std::max(result.peak_live, t.step().report.peak_live);

  // The serial run sees every replica's micro-batches in replica order: dp * m per step.
  const bool pipedream = std::is_same_v<Schedule, pipeline::pipedream>;
  const auto want = pipedream ? serial_pipedream(bounds, m, steps, updater, dp)
                              : serial_accumulation(bounds, m * dp, steps, updater);
  for (int c = 0; c < v; ++c) {
    const int s = c * p + r;
    const std::vector<double> got = flat_parameters(t.chunks()[c]);
    for (std::size_t i = 0; i < t.chunks()[c].tensor_count(); ++i) append_bytes(t.chunks()[c], i, result.bits);
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double tolerance = dp > 1 ? 1e-12 * std::max(1.0, std::abs(want[s][i])) : 0.0;
      if (std::abs(got[i] - want[s][i]) <= tolerance) continue;
      if (result.wrong++ == 0) {
        result.first = std::string(Schedule::name) + " stage " + std::to_string(s) + " parameter " + std::to_string(i) +
                       ": " + std::to_string(got[i]) + ", serial " + std::to_string(want[s][i]);
      }
    }
  }
  return result;
}

}  // namespace dtrain::testing
