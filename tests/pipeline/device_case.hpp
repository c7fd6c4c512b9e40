#pragma once
// One rank of a device-pipeline exactness case, shared by the test under Thrust's CPP system
// (device_executor.cpp: TCP, host memory) and the GPU's (../gpu/device_pipeline_cuda.cu: ranks
// sharing a GPU): runs this rank's chunks of the test network under a schedule with
// `pipeline::executor` over a point-to-point communicator, updates them as pipeline::trainer does
// (the mean gradient once a step; each micro-batch's under PipeDream), and counts the parameters
// that differ from the serial reference. Tensors are read and written through Thrust's copies, so
// the one driver serves host spans and device spans.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "dtrain/concepts/updater.hpp"
#include "dtrain/cuda/thrust_space.hpp"
#include "dtrain/pipeline/device_link.hpp"
#include "dtrain/pipeline/partition.hpp"
#include "dtrain/pipeline/schedule.hpp"
#include "reference.hpp"

namespace dtrain::testing {

inline std::vector<double> tensor_on_host(thrust_buffer<double> t) {
  std::vector<double> v(t.size());
  detail::thrust_space::download<double>(std::span(v), thrust_buffer<const double>(t), {});
  return v;
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
  const auto want = pipedream ? serial_pipedream(bounds, m, steps, fresh) : serial_accumulation(bounds, m, steps, fresh);
  int wrong = 0;
  for (int c = 0; c < v; ++c) {
    std::vector<double> got;
    for (std::size_t i = 0; i < chunks[static_cast<std::size_t>(c)].tensor_count(); ++i) {
      const auto t = tensor_on_host(chunks[static_cast<std::size_t>(c)].parameters(i));
      got.insert(got.end(), t.begin(), t.end());
    }
    const auto& expected = want[static_cast<std::size_t>(c * p + r)];
    for (std::size_t i = 0; i < got.size(); ++i) {
      if (got[i] == expected[i]) continue;
      if (wrong++ == 0) {
        first = std::string(Schedule::name) + " stage " + std::to_string(c * p + r) + " parameter " +
                std::to_string(i) + ": " + std::to_string(got[i]) + ", serial " + std::to_string(expected[i]);
      }
    }
  }
  return wrong;
}

}  // namespace dtrain::testing
