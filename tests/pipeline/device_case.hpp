#pragma once
// One rank of a device-pipeline exactness case, shared by the test under Thrust's CPP system
// (device_executor.cpp: TCP, host memory) and the GPU's (../gpu/device_pipeline_cuda.cu: ranks
// sharing a GPU): runs this rank's chunks of the test network under a schedule with
// `pipeline::executor` over a point-to-point communicator, updates them as pipeline::trainer does
// (the mean gradient once a step; each micro-batch's under PipeDream), and counts the parameters
// that differ from the serial reference. Tensors are read and written through Thrust's copies, so
// the one driver serves host spans and device spans.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "dtrain/concepts/updater.hpp"
#include "dtrain/cuda/thrust_space.hpp"
#include "dtrain/pipeline/device_link.hpp"
#include "dtrain/pipeline/partition.hpp"
#include "dtrain/pipeline/schedule.hpp"
#include "dtrain/pipeline/trainer.hpp"
#include "dtrain/updater/device.hpp"
#include "reference.hpp"

namespace dtrain::testing {

inline std::vector<double> tensor_on_host(thrust_buffer<double> t) {
  return detail::thrust_space::to_host<double>(t, {});
}

/// This rank's parameters, every chunk's tensors in order, read back to the host.
template <class Stage>
std::vector<double> chunk_parameters(Stage& chunk) {
  std::vector<double> got;
  for (std::size_t i = 0; i < chunk.tensor_count(); ++i) {
    const auto t = tensor_on_host(chunk.parameters(i));
    got.insert(got.end(), t.begin(), t.end());
  }
  return got;
}

/// How many parameters of `chunks` (chunk c being stage c p + r) differ from `want` (per stage)
/// by more than `tolerance` relative; `first` names the first.
template <class Stage>
int count_wrong(std::span<Stage> chunks, const std::vector<std::vector<double>>& want, int p, int r,
                std::string_view schedule, double tolerance, std::string& first) {
  int wrong = 0;
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    const int s = static_cast<int>(c) * p + r;
    const auto got = chunk_parameters(chunks[c]);
    const auto& expected = want[static_cast<std::size_t>(s)];
    for (std::size_t i = 0; i < got.size(); ++i) {
      if (std::abs(got[i] - expected[i]) <= tolerance * std::max(1.0, std::abs(expected[i]))) continue;
      if (wrong++ == 0) {
        first = std::string(schedule) + " stage " + std::to_string(s) + " parameter " + std::to_string(i) + ": " +
                std::to_string(got[i]) + ", serial " + std::to_string(expected[i]);
      }
    }
  }
  return wrong;
}

/// @returns how many of this rank's parameters differ from the serial reference after `steps`
/// steps of `m` micro-batches; `first` names the first. `make(widths, first, last, batch)`
/// builds a chunk's stage.
template <class Stage, class Comm, class Schedule, class Updater, class Make>
int device_case_wrong(Comm& comm, const Schedule& schedule, Updater updater, int m, int steps, Make make,
                      std::string& first) {
  const Updater fresh = updater;  // the serial run starts from no state
  const int p = comm.size(), r = comm.rank(), v = schedule.chunks();
  const auto widths = test_widths();
  const pipeline::partition bounds = pipeline::uniform_partition(static_cast<int>(widths.size()) - 1, p * v);
  std::vector<Stage> chunks;
  for (int c = 0; c < v; ++c) chunks.push_back(make(widths, bounds[c * p + r], bounds[c * p + r + 1], test_batch));
  constexpr bool pipedream = std::is_same_v<Schedule, pipeline::pipedream>;
  pipeline::executor_options eo;
  if constexpr (std::is_same_v<Schedule, pipeline::gpipe>) eo.rematerialise = schedule.rematerialise;
  eo.stash_weights = pipedream;
  pipeline::executor<Comm, Stage> run(comm, std::span(chunks), eo);
  const pipeline::pipeline_shape shape{p, v, m};
  run.handshake(shape, Schedule::name);
  std::size_t n = 0;
  for (auto& c : chunks) {
    for (std::size_t i = 0; i < c.tensor_count(); ++i) n += c.parameters(i).size();
  }
  updater.resize(n);
  std::uint64_t updates = 0;
  pipeline::step_hooks hooks;
  hooks.optimizer_step = [&](int) {
    const double scale = pipedream ? 1.0 : 1.0 / m;
    std::size_t offset = 0;
    ++updates;
    for (auto& c : chunks) {
      for (std::size_t i = 0; i < c.tensor_count(); ++i) {
        std::vector<double> w = tensor_on_host(c.parameters(i)), g = tensor_on_host(c.gradients(i));
        for (double& x : g) x *= scale;
        step_info info;
        info.step = updates;
        updater.step(std::span(w), std::span<const double>(g), offset, info);
        offset += g.size();
        detail::thrust_space::upload<double>(c.parameters(i), std::span<const double>(w), {});
        detail::thrust_space::zero<double>(c.gradients(i), {});
      }
    }
  };
  const auto actions = schedule.actions(r, shape);
  for (int s = 0; s < steps; ++s) run.run(actions, shape, static_cast<std::uint64_t>(s), hooks);
  const auto want =
      pipedream ? serial_pipedream(bounds, m, steps, fresh) : serial_accumulation(bounds, m, steps, fresh);
  return count_wrong(std::span(chunks), want, p, r, Schedule::name, 0.0, first);
}

/// What one rank of a device trainer case left: parameters off the serial run (the first
/// named) and its parameters' bits (data-parallel replicas must hold the same).
struct device_trainer_result {
  int wrong = 0;
  std::string first;
  std::vector<std::byte> bits;
};

/// One rank of a data x pipeline parallel job on device memory: `pipeline::trainer` over
/// `pipeline` (a point-to-point communicator of the pp group) with `replicas` (a collective of the
/// dp group; this rank is replica `replica`), device stages from `make(widths, first, last, batch,
/// replica, replicas)` and a `device_updater`. With `resume_after` > 0 (and one replica) the
/// trainer is saved to `checkpoint` after that many steps and a new one, from fresh stages, loads
/// it and runs the rest.
/// Compared with serial accumulation over every replica's micro-batches (within 1e-12 relative
/// with several replicas, whose average sums in another order; bit for bit otherwise).
template <class Stage, class Comm, class Replicas, class Schedule, class Updater, class Make>
device_trainer_result device_trainer_case(Comm pipeline, Replicas replicas, int replica, const Schedule& schedule,
                                          const Updater& updater, int m, int steps, Make make, int resume_after = 0,
                                          const std::string& checkpoint = {}) {
  const int p = pipeline.size(), r = pipeline.rank(), v = schedule.chunks(), dp = replicas.size();
  const auto widths = test_widths();
  const pipeline::partition bounds = pipeline::uniform_partition(static_cast<int>(widths.size()) - 1, p * v);
  auto chunks = [&] {
    std::vector<Stage> out;
    for (int c = 0; c < v; ++c)
      out.push_back(make(widths, bounds[c * p + r], bounds[c * p + r + 1], test_batch, replica, dp));
    return out;
  };
  pipeline::trainer_options o;
  o.micro_batches = m;
  o.bucket_bytes = 256;  // several buckets per chunk
  using trainer_t = pipeline::trainer<Comm, Schedule, device_updater<Updater>, Stage, Replicas>;
  trainer_t t(std::move(pipeline), chunks(), device_updater<Updater>(updater), schedule, o, std::move(replicas));
  const int first_steps = resume_after > 0 ? resume_after : steps;
  for (int i = 0; i < first_steps; ++i) t.step();
  trainer_t* last = &t;
  std::optional<trainer_t> resumed;
  if (resume_after > 0 && !std::is_same_v<Replicas, pipeline::single_replica>) {
    throw error(errc::invalid_argument, "device_trainer_case: resuming is written for one replica");
  }
  if constexpr (std::is_same_v<Replicas, pipeline::single_replica>) {
    if (resume_after > 0) {  // the communicator moves on to the new trainer; `t` is not used again
      t.save(checkpoint);
      resumed.emplace(std::move(t.pipeline()), chunks(), device_updater<Updater>(updater), schedule, o);
      resumed->load(checkpoint);
      for (int i = resume_after; i < steps; ++i) resumed->step();
      last = &*resumed;
    }
  }
  const bool pipedream = std::is_same_v<Schedule, pipeline::pipedream>;
  const auto want = pipedream ? serial_pipedream(bounds, m, steps, updater, dp)
                              : serial_accumulation(bounds, m * dp, steps, updater);
  device_trainer_result result;
  result.wrong = count_wrong(last->chunks(), want, p, r, Schedule::name, dp > 1 ? 1e-12 : 0.0, result.first);
  for (auto& chunk : last->chunks()) {
    const auto values = chunk_parameters(chunk);
    result.bits.resize(result.bits.size() + values.size() * sizeof(double));
    std::memcpy(result.bits.data() + result.bits.size() - values.size() * sizeof(double), values.data(),
                values.size() * sizeof(double));
  }
  return result;
}

}  // namespace dtrain::testing
