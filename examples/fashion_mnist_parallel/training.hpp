#pragma once
// The model-parallel examples' training loop, written once for host and device memory: a device
// mesh {dp, pp, tp} over the world's ranks, the MLP cut into stages, `Stage`s tensor-parallel over
// the tp group, the pipeline trainer over the pp group averaging over the dp group, progress lines,
// test accuracy after each epoch, samples/s and the measured bubble. `Layout` names the types:
// the world's transport, the pp, tp and dp collectives (each from its process group: see `form`), the
// stage and the updater (main.cpp's host_layout; device_training.cpp's for device memory). No fmt
// or CLI here: nvcc compiles this too.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <dtrain/collective/communicator.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/data/sampler.hpp>
#include <dtrain/pipeline/link.hpp>
#include <dtrain/pipeline/partition.hpp>
#include <dtrain/pipeline/schedule.hpp>
#include <dtrain/pipeline/trainer.hpp>
#include <dtrain/topology/mesh.hpp>
#include <dtrain/transport/group.hpp>
#include <dtrain/updater/lr_schedule.hpp>
#include <dtrain/updater/momentum.hpp>

#include "settings.hpp"

namespace fashion_mnist {

template <class T>
std::string joined(const std::vector<T>& v, const char* separator) {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) out += (i > 0 ? separator : "") + std::to_string(v[i]);
  return out;
}

// Test accuracy: this replica's share of the test set runs forward through the pipeline (stage
// s's output to stage s + 1, chunk by chunk, over the pipeline's own link), the last stage counts
// what it got right, and the world sums the counts.
template <class Trainer, class Mesh, class World>
double evaluate(Trainer& trainer, sample_source& source, const split& test, Mesh& mesh, World& world,
                std::size_t micro) {
  const int dp = mesh.axes()[0].size, replica = mesh.coordinate("dp");
  const std::size_t share = test.size() / static_cast<std::size_t>(dp) / micro * micro;
  std::vector<std::size_t> order(share);
  for (std::size_t i = 0; i < share; ++i) order[i] = static_cast<std::size_t>(replica) * share + i;
  source = {&test, order, micro};
  auto& pipe = trainer.pipeline();
  using link = dtrain::pipeline::link<std::remove_reference_t<decltype(pipe)>, float>;
  const auto& shape = trainer.shape();
  const auto deadline = dtrain::deadline::after(std::chrono::seconds(120));
  constexpr std::uint64_t tag = 0x6576616c'00000000;  // "eval", clear of the trainer's tags
  auto chunks = trainer.chunks();
  for (auto& c : chunks) c.reset_hits();
  typename link::buffer in, out;
  for (int mb = 0; mb < static_cast<int>(share / micro); ++mb) {
    const dtrain::micro_batch m{0, mb, static_cast<int>(share / micro)};
    for (std::size_t c = 0; c < chunks.size(); ++c) {
      const int s = shape.stage_of(pipe.rank(), static_cast<int>(c));
      link::resize(in, chunks[c].input_size());
      link::resize(out, chunks[c].output_size());
      if (s > 0) {
        link::irecv(pipe, (s - 1) % shape.ranks, tag + static_cast<std::uint64_t>(s), link::view(in)).wait(deadline);
      }
      chunks[c].forward(m, typename link::const_span(link::view(in)), link::view(out));
      chunks[c].discard(m);
      if (s + 1 < shape.stages()) {
        dtrain::signature sig;
        sig.count = chunks[c].output_size();
        link::isend(pipe, (s + 1) % shape.ranks, tag + static_cast<std::uint64_t>(s + 1), sig,
                    typename link::const_span(link::view(out)))
            .wait(deadline);
      }
    }
  }
  std::vector<double> hits{0};
  const bool counts = mesh.coordinate("tp") == 0 && (shape.stages() - 1) % shape.ranks == pipe.rank();
  for (auto& c : chunks) hits[0] += counts ? static_cast<double>(c.hits()) : 0.0;
  world.allreduce(std::span(hits), dtrain::reduce_op::sum);
  return hits[0] / static_cast<double>(share * static_cast<std::size_t>(dp));
}

/// The collective `C` of the mesh's `axis`: built from the axis's process group, or formed over it
/// by `Layout::form` where the layout has one (NCCL's communicators, collective on the group).
template <class Layout, class C, class Mesh>
C form(Mesh& mesh, const char* axis) {
  if constexpr (requires { Layout::template form<C>(mesh.group(axis), axis); }) {
    return Layout::template form<C>(mesh.group(axis), axis);
  } else {
    return C(mesh.group(axis));
  }
}

/// Trains `s` with `schedule` on `Layout`'s memory over `transport` (this rank's, of every rank's
/// world); returns the exit status: 0, or 3 below `s.min_accuracy`.
template <class Layout, class Schedule>
int train(const settings& s, Schedule schedule, typename Layout::transport transport, const split& train_set,
          const split& test, const char* program) {
  using group = dtrain::process_group<typename Layout::transport>;
  group world(std::move(transport));
  const int ranks = world.size();
  if (ranks % (s.pp * s.tp) != 0) {
    throw dtrain::error(dtrain::errc::invalid_argument, std::to_string(ranks) + " ranks do not split into --pp " +
                                                            std::to_string(s.pp) + " x --tp " + std::to_string(s.tp));
  }
  const int dp = ranks / (s.pp * s.tp);
  dtrain::device_mesh<typename Layout::transport> mesh(world, {{"dp", dp}, {"pp", s.pp}, {"tp", s.tp}});
  const std::size_t local_batch = s.global_batch / static_cast<std::size_t>(dp);
  const std::size_t micro = local_batch / static_cast<std::size_t>(s.micro_batches);
  if (s.global_batch % static_cast<std::size_t>(dp) != 0 ||
      local_batch % static_cast<std::size_t>(s.micro_batches) != 0) {
    throw dtrain::error(dtrain::errc::invalid_argument,
                        "--batch " + std::to_string(s.global_batch) + " does not split into " + std::to_string(dp) +
                            " replicas x " + std::to_string(s.micro_batches) + " micro-batches");
  }
  const std::size_t train_samples = s.limit_train > 0 ? std::min(s.limit_train, train_set.size()) : train_set.size();
  std::vector<int> widths{static_cast<int>(pixels_per_image)};
  widths.insert(widths.end(), s.hidden.begin(), s.hidden.end());
  widths.push_back(classes);
  if (s.tp > 1 && (widths.size() - 1) % 2 != 0) {
    throw dtrain::error(
        dtrain::errc::invalid_argument,
        "--tp needs an even number of layers (column/row pairs): give an odd number of --hidden widths");
  }
  const int v = schedule.chunks();
  const auto bounds = cut(widths, s.pp * v, s.tp > 1);

  auto tensor_group = form<Layout, typename Layout::tp_collective>(mesh, "tp");
  dtrain::communicator<group> everyone(world);
  sample_source source;
  std::vector<typename Layout::stage> chunks;
  for (int c = 0; c < v; ++c) {
    const int st = c * s.pp + mesh.coordinate("pp");
    chunks.emplace_back(tensor_group, widths, bounds[st], bounds[st + 1], source, s.seed);
  }
  dtrain::data::distributed_sampler sampler(train_samples, mesh.coordinate("dp"), dp, s.seed);
  const std::size_t steps_per_epoch = sampler.shard_size() / local_batch;
  dtrain::pipeline::trainer_options options;
  options.micro_batches = s.micro_batches;
  options.learning_rate = dtrain::lr_schedule{s.lr, 1.0, 0, steps_per_epoch * static_cast<std::size_t>(s.epochs), 0.0};
  using pipe = typename Layout::pp_collective;
  using replicas = typename Layout::dp_collective;
  auto pipe_group = form<Layout, pipe>(mesh, "pp");  // tp, pp, dp: one order on every rank (`form` may be collective)
  auto replica_group = form<Layout, replicas>(mesh, "dp");
  dtrain::pipeline::trainer<pipe, Schedule, typename Layout::updater, typename Layout::stage, replicas> trainer(
      std::move(pipe_group), std::move(chunks), typename Layout::updater(dtrain::momentum<float>(s.lr, s.momentum)),
      schedule, options, std::move(replica_group));

  const bool reporter = mesh.coordinate("dp") == 0 && mesh.coordinate("tp") == 0 &&
                        (trainer.shape().stages() - 1) % s.pp == mesh.coordinate("pp");
  if (reporter) {
    std::printf("%s: %d ranks = %d data x %d pipeline x %d tensor parallel on %s, %s%s, MLP %s, stages at layers %s, "
                "global batch %zu = %d x %d micro-batches of %zu, %zu steps per epoch\n",
                program, ranks, dp, s.pp, s.tp, Layout::memory, std::string(Schedule::name).c_str(),
                v > 1 ? (" (v " + std::to_string(v) + ")").c_str() : "", joined(widths, "-").c_str(),
                joined(std::vector<int>(bounds.begin(), bounds.end()), ",").c_str(), s.global_batch, dp,
                s.micro_batches, micro, steps_per_epoch);
  }
  double compute = 0, wall = 0, train_seconds = 0, accuracy = 0;
  std::vector<double> epoch_seconds;
  for (int epoch = 0; epoch < s.epochs; ++epoch) {
    const auto order = sampler.indices(static_cast<std::uint64_t>(epoch));
    const auto start = clock_type::now();
    auto window_start = start;
    double window_loss = 0;
    for (std::size_t step = 0; step < steps_per_epoch; ++step) {
      source = {&train_set, std::span(order).subspan(step * local_batch, local_batch), micro};
      const auto r = trainer.step();
      compute += r.report.compute_seconds;
      wall += r.report.wall_seconds - r.report.update_seconds;
      window_loss += r.loss;
      if (reporter && s.log_every > 0 && (step + 1) % s.log_every == 0) {
        std::printf("epoch %2d  step %6zu  loss %.4f  samples/s %8.0f\n", epoch + 1,
                    static_cast<std::size_t>(trainer.steps()), window_loss / double(s.log_every),
                    double(s.log_every * s.global_batch) / since(window_start));
        window_loss = 0;
        window_start = clock_type::now();
      }
    }
    const double seconds = since(start);
    train_seconds += seconds;
    epoch_seconds.push_back(seconds);
    accuracy = evaluate(trainer, source, test, mesh, everyone, micro);
    if (reporter) {
      std::printf("epoch %2d done in %.2f s: %.0f samples/s, test accuracy %.4f\n", epoch + 1, seconds,
                  double(steps_per_epoch * s.global_batch) / seconds, accuracy);
    }
  }
  // The bubble: the share of the ranks' pipeline time (a step but its update) not spent in
  // forward or backward.
  std::vector<double> busy{compute, wall};
  everyone.allreduce(std::span(busy), dtrain::reduce_op::sum);
  const double bubble = 1.0 - busy[0] / busy[1];
  const double samples_per_second = double(steps_per_epoch * s.global_batch * epoch_seconds.size()) / train_seconds;
  if (reporter) {
    std::printf("%s: %.0f samples/s, bubble %.3f (a balanced pipeline's (p-1)/(v m+p-1): %.3f), test accuracy %.4f\n",
                program, samples_per_second, bubble, dtrain::pipeline::bubble_fraction(s.pp, s.micro_batches, v),
                accuracy);
    if (!s.json.empty()) {
      std::string seconds;
      for (std::size_t i = 0; i < epoch_seconds.size(); ++i) {
        char b[32];
        std::snprintf(b, sizeof b, "%s%.3f", i > 0 ? "," : "", epoch_seconds[i]);
        seconds += b;
      }
      char line[512];
      std::snprintf(line, sizeof line,
                    "{\"ranks\":%d,\"dp\":%d,\"pp\":%d,\"tp\":%d,\"memory\":\"%s\",\"schedule\":\"%s\","
                    "\"micro_batches\":%d,\"samples_per_second\":%.1f,\"bubble\":%.4f,\"test_accuracy\":%.4f,"
                    "\"epoch_seconds\":[%s]}\n",
                    ranks, dp, s.pp, s.tp, Layout::memory, std::string(Schedule::name).c_str(), s.micro_batches,
                    samples_per_second, bubble,
                    accuracy, seconds.c_str());
      std::ofstream(s.json) << line;
    }
  }
  std::fflush(stdout);
  return accuracy >= s.min_accuracy ? 0 : 3;
}

/// `f(schedule)` for the schedule `s.schedule` names.
template <class F>
int with_schedule(const settings& s, F&& f) {
  namespace pl = dtrain::pipeline;
  if (s.schedule == "gpipe") return f(pl::gpipe{});
  if (s.schedule == "gpipe-remat") return f(pl::gpipe{true});
  if (s.schedule == "interleaved") return f(pl::interleaved_one_f_one_b{2});
  if (s.schedule == "pipedream") return f(pl::pipedream{});
  return f(pl::one_f_one_b{});
}

}  // namespace fashion_mnist
