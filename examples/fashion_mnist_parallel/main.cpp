// Fashion-MNIST with model parallelism: an MLP of 1024-wide layers split into pipeline stages
// (--pp) and tensor-parallel slices (--tp), replicated data-parallel over the remaining ranks,
// on a device mesh {dp, pp, tp} of TCP processes.
//
//   dtrain-run -n 4 ./fashion_mnist_parallel --pp 2              # 2 stages x 2 replicas
//   dtrain-run -n 4 ./fashion_mnist_parallel --tp 2              # 2-way tensor parallel x 2 replicas
//   dtrain-run -n 2 ./fashion_mnist_parallel --pp 2 --schedule gpipe --micro-batches 8
//   ./fashion_mnist_parallel                                     # the one-process reference
//
// Each replica trains on its shard of every epoch (global batch split evenly, then into
// micro-batches); the stages are cut by parameter count (with --tp, between MLP blocks). The
// rank holding the last stage of replica 0 prints progress; at the end every rank prints its
// share of the step spent computing, and the measured bubble.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <dtrain/collective/communicator.hpp>
#include <dtrain/data/sampler.hpp>
#include <dtrain/pipeline/partition.hpp>
#include <dtrain/pipeline/trainer.hpp>
#include <dtrain/topology/mesh.hpp>
#include <dtrain/transport/group.hpp>
#include <dtrain/transport/tcp.hpp>
#include <dtrain/updater/lr_schedule.hpp>
#include <dtrain/updater/momentum.hpp>

#include "stage.hpp"

namespace {

struct settings {
  std::string data = fashion_mnist::default_directory;
  int epochs = 5, pp = 1, tp = 1, micro_batches = 4;
  std::string schedule = "1f1b";
  std::size_t global_batch = 128;
  double lr = 0.05, momentum = 0.9;
  std::vector<int> hidden{1024, 1024, 1024};
  std::size_t log_every = 100, limit_train = 0;
  std::uint64_t seed = 1;
  std::string json;
  double min_accuracy = 0;
};

using group = dtrain::process_group<dtrain::tcp_transport>;
using comm = dtrain::communicator<group>;
using stage = fashion_mnist::parallel_stage<comm>;
using clock_type = std::chrono::steady_clock;
double since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

// The layers' boundaries between stages: by parameter count, and with tensor parallelism only
// after a row-parallel layer (an even index), where every rank holds the whole activation.
dtrain::pipeline::partition cut(const std::vector<int>& widths, int stages, bool blocks) {
  std::vector<double> params;
  for (std::size_t l = 0; l + 1 < widths.size(); ++l) {
    const double n = double(widths[l]) * widths[l + 1] + widths[l + 1];
    if (blocks && l % 2 == 1) params.back() += n;
    else params.push_back(n);
  }
  auto bounds = dtrain::pipeline::balanced_partition(params, stages);
  if (blocks) {
    for (int& b : bounds) b *= 2;
  }
  return bounds;
}

// Test accuracy: this replica's share of the test set runs forward through the pipeline
// (stage s's output to stage s + 1, chunk by chunk), the last stage counts what it got right,
// and the world sums the counts.
template <class Trainer>
double evaluate(Trainer& trainer, fashion_mnist::sample_source& source, const fashion_mnist::split& test,
                dtrain::device_mesh<dtrain::tcp_transport>& mesh, comm& world, std::size_t micro) {
  const int dp = mesh.axes()[0].size, replica = mesh.coordinate("dp");
  const std::size_t share = test.size() / static_cast<std::size_t>(dp) / micro * micro;
  std::vector<std::size_t> order(share);
  for (std::size_t i = 0; i < share; ++i) order[i] = static_cast<std::size_t>(replica) * share + i;
  source = {&test, order, micro};
  group& pipe = trainer.pipeline();
  const auto& shape = trainer.shape();
  const auto deadline = dtrain::deadline::after(std::chrono::seconds(120));
  constexpr std::uint64_t tag = 0x6576616c'00000000;  // "eval", clear of the trainer's tags
  auto chunks = trainer.chunks();
  for (auto& c : chunks) c.reset_hits();
  std::vector<float> in, out;
  for (int mb = 0; mb < static_cast<int>(share / micro); ++mb) {
    const dtrain::micro_batch m{0, mb, static_cast<int>(share / micro)};
    for (std::size_t c = 0; c < chunks.size(); ++c) {
      const int s = shape.stage_of(pipe.rank(), static_cast<int>(c));
      in.resize(chunks[c].input_size());
      out.resize(chunks[c].output_size());
      if (s > 0) pipe.irecv((s - 1) % shape.ranks, tag + static_cast<std::uint64_t>(s), std::as_writable_bytes(std::span(in))).wait(deadline);
      chunks[c].forward(m, in, out);
      chunks[c].discard(m);
      if (s + 1 < shape.stages()) {
        dtrain::signature sig;
        sig.count = out.size();
        pipe.isend((s + 1) % shape.ranks, tag + static_cast<std::uint64_t>(s + 1), sig, std::as_bytes(std::span(out))).wait(deadline);
      }
    }
  }
  std::vector<double> hits{0};
  const bool counts = mesh.coordinate("tp") == 0 && (shape.stages() - 1) % shape.ranks == pipe.rank();
  for (auto& c : chunks) hits[0] += counts ? static_cast<double>(c.hits()) : 0.0;
  world.allreduce(std::span(hits), dtrain::reduce_op::sum);
  return hits[0] / static_cast<double>(share * static_cast<std::size_t>(dp));
}

template <class Schedule>
int run(const settings& s, Schedule schedule) {
  group world(dtrain::tcp_transport::from_environment());
  const int ranks = world.size();
  if (ranks % (s.pp * s.tp) != 0) {
    throw dtrain::error(dtrain::errc::invalid_argument, fmt::format("{} ranks do not split into --pp {} x --tp {}", ranks, s.pp, s.tp));
  }
  const int dp = ranks / (s.pp * s.tp);
  dtrain::device_mesh<dtrain::tcp_transport> mesh(world, {{"dp", dp}, {"pp", s.pp}, {"tp", s.tp}});
  const std::size_t local_batch = s.global_batch / static_cast<std::size_t>(dp);
  const std::size_t micro = local_batch / static_cast<std::size_t>(s.micro_batches);
  if (s.global_batch % static_cast<std::size_t>(dp) != 0 || local_batch % static_cast<std::size_t>(s.micro_batches) != 0) {
    throw dtrain::error(dtrain::errc::invalid_argument, fmt::format("--batch {} does not split into {} replicas x {} micro-batches",
                                                                    s.global_batch, dp, s.micro_batches));
  }
  const auto train = fashion_mnist::load(s.data, "train");
  const auto test = fashion_mnist::load(s.data, "t10k");
  const std::size_t train_samples = s.limit_train > 0 ? std::min(s.limit_train, train.size()) : train.size();
  std::vector<int> widths{static_cast<int>(fashion_mnist::pixels_per_image)};
  widths.insert(widths.end(), s.hidden.begin(), s.hidden.end());
  widths.push_back(fashion_mnist::classes);
  if (s.tp > 1 && (widths.size() - 1) % 2 != 0) {
    throw dtrain::error(dtrain::errc::invalid_argument, "--tp needs an even number of layers (column/row pairs): give an odd number of --hidden widths");
  }
  const int v = schedule.chunks();
  const auto bounds = cut(widths, s.pp * v, s.tp > 1);

  comm tensor_group(mesh.group("tp")), everyone(world);
  fashion_mnist::sample_source source;
  std::vector<stage> chunks;
  for (int c = 0; c < v; ++c) {
    const int st = c * s.pp + mesh.coordinate("pp");
    chunks.emplace_back(tensor_group, widths, bounds[st], bounds[st + 1], source, s.seed);
  }
  dtrain::data::distributed_sampler sampler(train_samples, mesh.coordinate("dp"), dp, s.seed);
  const std::size_t steps_per_epoch = sampler.shard_size() / local_batch;
  dtrain::pipeline::trainer_options options;
  options.micro_batches = s.micro_batches;
  options.learning_rate = dtrain::lr_schedule{s.lr, 1.0, 0, steps_per_epoch * static_cast<std::size_t>(s.epochs), 0.0};
  dtrain::pipeline::trainer<group, Schedule, dtrain::momentum<float>, stage, comm> trainer(
      mesh.group("pp"), std::move(chunks), dtrain::momentum<float>(s.lr, s.momentum), schedule, options, comm(mesh.group("dp")));

  const bool reporter = mesh.coordinate("dp") == 0 && mesh.coordinate("tp") == 0 &&
                        (trainer.shape().stages() - 1) % s.pp == mesh.coordinate("pp");
  if (reporter) {
    fmt::print("fashion_mnist_parallel: {} ranks = {} data x {} pipeline x {} tensor parallel, {} {}, MLP {}, stages at layers {}, "
               "global batch {} = {} x {} micro-batches of {}, {} steps per epoch\n",
               ranks, dp, s.pp, s.tp, Schedule::name, v > 1 ? fmt::format("(v {})", v) : "", fmt::join(widths, "-"),
               fmt::join(bounds, ","), s.global_batch, dp, s.micro_batches, micro, steps_per_epoch);
  }
  double compute = 0, wall = 0, train_seconds = 0, accuracy = 0;
  std::vector<double> epoch_seconds;
  for (int epoch = 0; epoch < s.epochs; ++epoch) {
    const auto order = sampler.indices(static_cast<std::uint64_t>(epoch));
    const auto start = clock_type::now();
    auto window_start = start;
    double window_loss = 0;
    for (std::size_t step = 0; step < steps_per_epoch; ++step) {
      source = {&train, std::span(order).subspan(step * local_batch, local_batch), micro};
      const auto r = trainer.step();
      compute += r.report.compute_seconds;
      wall += r.report.wall_seconds - r.report.update_seconds;
      window_loss += r.loss;
      if (reporter && s.log_every > 0 && (step + 1) % s.log_every == 0) {
        fmt::print("epoch {:>2}  step {:>6}  loss {:.4f}  samples/s {:>8.0f}\n", epoch + 1, trainer.steps(),
                   window_loss / double(s.log_every), double(s.log_every * s.global_batch) / since(window_start));
        window_loss = 0;
        window_start = clock_type::now();
      }
    }
    const double seconds = since(start);
    train_seconds += seconds;
    epoch_seconds.push_back(seconds);
    accuracy = evaluate(trainer, source, test, mesh, everyone, micro);
    if (reporter) {
      fmt::print("epoch {:>2} done in {:.2f} s: {:.0f} samples/s, test accuracy {:.4f}\n", epoch + 1, seconds,
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
    fmt::print("fashion_mnist_parallel: {:.0f} samples/s, bubble {:.3f} (a balanced pipeline's (p-1)/(v m+p-1): {:.3f}), "
               "test accuracy {:.4f}\n",
               samples_per_second, bubble, dtrain::pipeline::bubble_fraction(s.pp, s.micro_batches, v), accuracy);
    if (!s.json.empty()) {
      std::ofstream out(s.json);
      out << fmt::format("{{\"ranks\":{},\"dp\":{},\"pp\":{},\"tp\":{},\"schedule\":\"{}\",\"micro_batches\":{},"
                         "\"samples_per_second\":{:.1f},\"bubble\":{:.4f},\"test_accuracy\":{:.4f},\"epoch_seconds\":[{:.3f}]}}\n",
                         ranks, dp, s.pp, s.tp, Schedule::name, s.micro_batches, samples_per_second, bubble, accuracy,
                         fmt::join(epoch_seconds, ","));
    }
  }
  return accuracy >= s.min_accuracy ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  settings s;
  CLI::App app{"Fashion-MNIST MLP trained with pipeline and tensor parallelism over TCP (launch with dtrain-run)"};
  app.add_option("--data", s.data, "directory of the IDX files (.gz or plain)")->capture_default_str();
  app.add_option("--epochs", s.epochs, "passes over the training set")->check(CLI::Range(1, 100000))->capture_default_str();
  app.add_option("--pp", s.pp, "pipeline stages")->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--tp", s.tp, "tensor-parallel ranks per stage")->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--schedule", s.schedule, "pipeline schedule")
      ->check(CLI::IsMember({"gpipe", "gpipe-remat", "1f1b", "interleaved", "pipedream"}))->capture_default_str();
  app.add_option("--micro-batches", s.micro_batches, "micro-batches per step")->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--batch", s.global_batch, "global batch (split across replicas)")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--lr", s.lr, "learning rate (cosine decay)")->capture_default_str();
  app.add_option("--momentum", s.momentum, "momentum")->capture_default_str();
  app.add_option("--hidden", s.hidden, "hidden layer widths")->delimiter(',')->capture_default_str();
  app.add_option("--log-every", s.log_every, "steps between progress lines (0: none)")->capture_default_str();
  app.add_option("--limit-train", s.limit_train, "use only the first N training samples (0: all)");
  app.add_option("--seed", s.seed, "initialisation and shuffling seed")->capture_default_str();
  app.add_option("--json", s.json, "write a summary as JSON (the reporting rank)");
  app.add_option("--min-accuracy", s.min_accuracy, "exit with status 3 below this test accuracy");
  CLI11_PARSE(app, argc, argv);
  try {
    namespace pl = dtrain::pipeline;
    if (s.schedule == "gpipe") return run(s, pl::gpipe{});
    if (s.schedule == "gpipe-remat") return run(s, pl::gpipe{true});
    if (s.schedule == "interleaved") return run(s, pl::interleaved_one_f_one_b{2});
    if (s.schedule == "pipedream") return run(s, pl::pipedream{});
    return run(s, pl::one_f_one_b{});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fashion_mnist_parallel: %s\n", e.what());
    return 1;
  }
}
