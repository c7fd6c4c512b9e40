// A model that does not fit a rank's memory budget, trained with its state sharded: a deep MLP on
// Fashion-MNIST (784-1024-1024-1024-1024-10 by default, 4.0 M parameters) under Adam, whose
// parameters, gradients and optimizer state take 16 bytes per parameter (61 MiB) on every rank of
// a data-parallel trainer, against a per-rank budget of 40 MiB. ZeRO stage 3 (FSDP's FULL_SHARD)
// keeps 1/P of that state per rank and gathers one layer at a time, so 4 ranks fit where 1 does
// not.
//
//   dtrain-run -n 4 ./sharded_mlp                      # fits: about 30 MiB per rank
//   dtrain-run -n 1 ./sharded_mlp                      # over the budget: says so, exits 4
//   dtrain-run -n 4 ./sharded_mlp --precision bf16     # mixed precision, fp32 master weights
//
// The budget is checked against the trainer's own accounting of its bytes (the largest over the
// ranks, after the first step and at every report); the process's peak resident memory over the
// first epoch's steps is printed beside it. Rank 0 prints progress and a summary.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <dtrain/allreduce/trainer.hpp>
#include <dtrain/collective/communicator.hpp>
#include <dtrain/data/sampler.hpp>
#include <dtrain/sharded/trainer.hpp>
#include <dtrain/sharded/unit_trainer.hpp>
#include <dtrain/sharded/whole_model.hpp>
#include <dtrain/transport/group.hpp>
#include <dtrain/transport/mixed.hpp>
#include <dtrain/updater/adam.hpp>

#include "../fashion_mnist/dataset.hpp"
#include "unit_mlp.hpp"

namespace {

struct settings {
  std::string data = fashion_mnist::default_directory;
  int epochs = 2;
  std::size_t global_batch = 128;
  double lr = 1e-3;
  std::vector<int> hidden{1024, 1024, 1024, 1024};
  std::string precision = "fp32";
  std::string trainer = "zero3";
  std::size_t limit_all_gathers = 2;
  double budget_mib = 40;
  std::size_t log_every = 50, limit_train = 0;
  std::uint64_t seed = 1;
  double min_accuracy = 0;
  std::string json;
};

constexpr int over_budget = 4;  // the exit status when the trainer needs more than the budget
struct over_budget_error {
  int rank;
};
constexpr double mib = 1024.0 * 1024.0;

using clock_type = std::chrono::steady_clock;
double since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

using group = dtrain::process_group<dtrain::mixed_transport>;

double in_mib(double bytes) { return bytes / mib; }
double in_mib(std::size_t bytes) { return static_cast<double>(bytes) / mib; }

// What the trainer holds, part by part; `gathered` is the whole model where a trainer keeps it.
std::string breakdown(const dtrain::sharded::memory_use& m, const std::string& trainer) {
  return fmt::format("parameters {:.1f}, gradients {:.1f}, Adam's state {:.1f}, buffers {:.1f}, {} {:.1f}, layer "
                     "gradients {:.1f}", in_mib(m.parameters), in_mib(m.gradients), in_mib(m.optimizer_state),
                     in_mib(m.buffers), trainer == "zero3" ? "gathered layers" : "the model held whole",
                     in_mib(m.gathered), in_mib(m.unit_gradients));
}

// A /proc/self/status field in bytes (VmRSS, VmHWM); 0 where there is no /proc.
double status_bytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1)) * 1024;  // kB
  }
  return 0;
}
// Resets the peak resident size to the current one (Linux 4.0+), so VmHWM then counts from here.
void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

// What every trainer's run shares: the ranks, the data, the model, the example's own sums.
template <class T>
struct job {
  const settings& s;
  group world{dtrain::mixed_transport::from_environment()};
  group totals = *world.split(0, world.rank());  // the example's own sums, in their own tags
  dtrain::communicator<group> sums{totals};
  int rank = world.rank(), ranks = world.size();
  std::size_t P = static_cast<std::size_t>(ranks), local_batch = s.global_batch / P;
  fashion_mnist::split train_set = fashion_mnist::load(s.data, "train"), test_set = fashion_mnist::load(s.data, "t10k");
  sharded_mlp::unit_mlp<T> model;
  double rss_start = 0;

  explicit job(const settings& settings_) : s(settings_), model(widths(), train_set, s.seed) {
    if (s.global_batch % P != 0) {
      throw dtrain::error(dtrain::errc::invalid_argument,
                          fmt::format("--batch {} does not split evenly across {} ranks", s.global_batch, ranks));
    }
    const auto n = static_cast<double>(model.parameter_count());
    if (rank == 0) {
      fmt::print("sharded_mlp: {} rank(s), {}, MLP {} ({:.2f} M parameters, {}), Adam lr {}, global batch {} ({} per "
                 "rank), {} training samples\n", ranks, s.trainer, fmt::join(widths(), "-"), n / 1e6, s.precision,
                 s.lr, s.global_batch, local_batch, train_samples());
      fmt::print("memory per rank, budget {:.1f} MiB: a replicated trainer holds 16 B per parameter ({:.1f} MiB: {}); "
                 "stage 3 holds 16/P ({:.1f} MiB at P = {}) plus up to {} gathered layers\n",
                 s.budget_mib, in_mib(16 * n), 16 * n > s.budget_mib * mib ? "does not fit" : "fits",
                 in_mib(16 * n / static_cast<double>(P)), ranks, s.limit_all_gathers);
    }
    reset_peak_rss();  // what the trainer allocates from here on is measured
    rss_start = status_bytes("VmRSS");
  }

  std::vector<int> widths() const {  // 784, the hidden widths, 10
    std::vector<int> w{static_cast<int>(fashion_mnist::pixels_per_image)};
    w.insert(w.end(), s.hidden.begin(), s.hidden.end());
    w.push_back(fashion_mnist::classes);
    return w;
  }
  std::size_t train_samples() const {
    return s.limit_train > 0 ? std::min(s.limit_train, train_set.size()) : train_set.size();
  }

  // The largest of every rank's values (each rank's are its own: slices differ by one padding).
  std::vector<double> largest(std::vector<double> v) {
    sums.allreduce(std::span(v), dtrain::reduce_op::max);
    return v;
  }

  // Trains with `trainer`; `held()` is what it holds at most so far (a sharded::memory_use), and
  // `unit(u)` layer u's parameters, whole, for evaluation.
  template <class Trainer, class Held, class Unit>
  int run(Trainer& trainer, Held&& held, Unit&& unit) {
    const double budget = s.budget_mib * mib;
    auto check_budget = [&] {
      const auto peak = held();
      const auto worst = largest({static_cast<double>(peak.total())})[0];
      if (worst <= budget) return worst;
      if (rank == 0) {
        fmt::print(stderr, "sharded_mlp: the trainer holds {:.1f} MiB on its fullest rank ({} on rank 0), over the "
                   "--budget-mib {:.1f}: run on more ranks (dtrain-run -n N), or lower --limit-all-gathers\n",
                   in_mib(worst), breakdown(peak, s.trainer), s.budget_mib);
      }
      throw over_budget_error{rank};  // on every rank: the maximum is the same everywhere
    };
    // The test set in chunks of 250 split across ranks, one whole layer at a time.
    auto evaluate = [&] {
      const std::size_t share = (test_set.size() + P - 1) / P, chunk = 250;
      const std::size_t first = std::min(test_set.size(), share * static_cast<std::size_t>(rank));
      const std::size_t last = std::min(test_set.size(), first + share);
      std::vector<double> counts{0.0, 0.0};  // correct, loss
      const std::size_t chunks = (share + chunk - 1) / chunk;  // the same on every rank: gathers are collective
      for (std::size_t c = 0; c < chunks; ++c) {
        const std::size_t at = std::min(last, first + c * chunk), count = std::min(chunk, last - at);
        const auto [hits, loss] = model.evaluate(test_set, at, count, unit);
        counts[0] += static_cast<double>(hits);
        counts[1] += loss;
      }
      sums.allreduce(std::span(counts), dtrain::reduce_op::sum);
      const auto n = static_cast<double>(test_set.size());
      return std::pair(counts[0] / n, counts[1] / n);
    };

    dtrain::data::distributed_sampler sampler(train_samples(), rank, ranks, s.seed);
    const std::size_t steps_per_epoch = sampler.shard_size() / local_batch;
    double train_seconds = 0, accuracy = 0, test_loss = 0, peak_rss = 0, worst_bytes = 0;
    for (int epoch = 0; epoch < s.epochs; ++epoch) {
      const auto order = sampler.indices(static_cast<std::uint64_t>(epoch));
      const auto start = clock_type::now();
      auto window_start = start;
      double window_loss = 0, epoch_loss = 0;
      std::size_t window_steps = 0;
      for (std::size_t step = 0; step < steps_per_epoch; ++step) {
        const auto result = trainer.step(std::span(order).subspan(step * local_batch, local_batch));
        if (epoch == 0 && step == 0) worst_bytes = check_budget();
        window_loss += result.loss;
        epoch_loss += result.loss;
        ++window_steps;
        if (s.log_every > 0 && (step + 1) % s.log_every == 0) {
          worst_bytes = check_budget();
          const double loss = largest({window_loss})[0];  // the worst rank's, a cheap honest figure
          if (rank == 0) {
            fmt::print("epoch {:>2}  step {:>5}  loss {:.4f} (worst rank)  samples/s {:>7.0f}  trainer {:.1f} MiB\n",
                       epoch + 1, trainer.steps(), loss / static_cast<double>(window_steps),
                       static_cast<double>(window_steps * s.global_batch) / since(window_start), in_mib(worst_bytes));
          }
          window_loss = 0;
          window_steps = 0;
          window_start = clock_type::now();
        }
      }
      const double seconds = since(start);
      train_seconds += seconds;
      if (epoch == 0) peak_rss = largest({status_bytes("VmHWM") - rss_start})[0];
      std::vector<double> mean_loss{epoch_loss / static_cast<double>(steps_per_epoch)};
      sums.allreduce(std::span(mean_loss), dtrain::reduce_op::avg);
      std::tie(accuracy, test_loss) = evaluate();
      if (rank == 0) {
        fmt::print("epoch {:>2}/{}  train loss {:.4f}  test accuracy {:.4f}  test loss {:.4f}  {:.1f} s  {:.0f} "
                   "samples/s\n", epoch + 1, s.epochs, mean_loss[0], accuracy, test_loss, seconds,
                   static_cast<double>(steps_per_epoch * s.global_batch) / seconds);
      }
    }
    worst_bytes = check_budget();
    const double samples_per_second =
        static_cast<double>(static_cast<std::size_t>(s.epochs) * steps_per_epoch * s.global_batch) / train_seconds;
    if (rank == 0) {
      const auto peak = held();
      fmt::print("final test accuracy {:.4f}; {:.0f} samples/s on {} rank(s); per rank: the trainer's peak {:.1f} "
                 "MiB of a {:.1f} MiB budget ({} on rank 0), resident memory grown by {:.1f} MiB over the first "
                 "epoch's steps\n", accuracy, samples_per_second, ranks, in_mib(worst_bytes), s.budget_mib,
                 breakdown(peak, s.trainer), in_mib(peak_rss));
      if (!s.json.empty()) {
        std::ofstream out(s.json);
        out << fmt::format("{{\"trainer\":\"{}\",\"ranks\":{},\"parameters\":{},\"precision\":\"{}\","
                           "\"samples_per_second\":{:.1f},\"test_accuracy\":{:.4f},\"trainer_peak_bytes\":{:.0f},"
                           "\"rss_growth_bytes\":{:.0f},\"parameters_bytes\":{},\"gradients_bytes\":{},"
                           "\"optimizer_state_bytes\":{},\"gathered_bytes\":{},\"unit_gradients_bytes\":{}}}\n",
                           s.trainer, ranks, model.parameter_count(), s.precision, samples_per_second, accuracy,
                           worst_bytes, peak_rss, peak.parameters, peak.gradients, peak.optimizer_state,
                           peak.gathered, peak.unit_gradients);
        if (!out) throw dtrain::error(dtrain::errc::bad_data, "cannot write " + s.json);
      }
    }
    return accuracy >= s.min_accuracy ? 0 : 3;
  }
};

// Layer u of a model held whole, its tensors side by side in float (as unit_parameters gives it).
template <class Whole>
std::vector<float> whole_unit(Whole& whole, std::size_t u) {
  std::vector<float> out;
  for (std::size_t i = whole.first(u); i < whole.first(u + 1); ++i) {
    for (const auto x : whole.parameters(i)) out.push_back(static_cast<float>(x));
  }
  return out;
}

template <class T>
int train(const settings& s) {
  job<T> j(s);
  dtrain::adam<float> adam(s.lr);
  using comm = dtrain::communicator<group>;
  if (s.trainer == "zero3") {
    dtrain::sharded::trainer_options options;
    options.limit_all_gathers = s.limit_all_gathers;
    dtrain::sharded::trainer<comm, dtrain::sharded::zero3, dtrain::adam<float>, sharded_mlp::unit_mlp<T>> trainer(
        comm(j.world), adam, j.model, options);
    return j.run(trainer, [&] { return trainer.peak_memory(); },
                 [&](std::size_t u) { return trainer.unit_parameters(u); });
  }
  // The same model held whole on every rank: stage 2 shards the rest, the allreduce trainer nothing.
  dtrain::sharded::whole_model whole(j.model);
  auto unit = [&](std::size_t u) { return whole_unit(whole, u); };
  if (s.trainer == "zero2") {
    dtrain::sharded::trainer<comm, dtrain::sharded::zero2, dtrain::adam<float>, decltype(whole)> trainer(
        comm(j.world), adam, whole, {});
    return j.run(trainer, [&] {
      auto m = trainer.peak_memory();
      m.gathered = whole.bytes();  // the model's own: all of it, on every rank
      return m;
    }, unit);
  }
  if constexpr (std::is_same_v<T, float>) {
    dtrain::allreduce::trainer trainer(comm(j.world), adam, whole);
    return j.run(trainer, [&] {
      dtrain::sharded::memory_use m;
      m.gathered = whole.bytes();
      m.optimizer_state = trainer.updater().parameters() * dtrain::adam<float>::state_slots * sizeof(float);
      return m;
    }, unit);
  } else {
    throw dtrain::error(dtrain::errc::invalid_argument, "--trainer allreduce trains fp32 only (mixed precision is "
                                                        "the sharded trainers')");
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress shows as it happens, through dtrain-run's pipes too
  settings s;
  CLI::App app{"A deep MLP on Fashion-MNIST trained with ZeRO stage 3 under a per-rank memory budget (launch "
               "with dtrain-run)"};
  app.add_option("--data", s.data, "directory of the IDX files (.gz or plain)")->capture_default_str();
  app.add_option("--epochs", s.epochs, "passes over the training set")
      ->check(CLI::Range(1, 100000))->capture_default_str();
  app.add_option("--batch", s.global_batch, "global batch (split across ranks)")
      ->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--lr", s.lr, "Adam's learning rate")->capture_default_str();
  app.add_option("--hidden", s.hidden, "hidden layer widths")
      ->delimiter(',')->check(CLI::Range(1, 1 << 16))->capture_default_str();
  app.add_option("--precision", s.precision,
                 "parameters and gradients: fp32, or bf16 with fp32 master weights and state")
      ->check(CLI::IsMember({"fp32", "bf16"}))->capture_default_str();
  app.add_option("--trainer", s.trainer, "zero3 (parameters sharded too), or the model held whole on every rank: "
                 "zero2 (gradients and state sharded) or allreduce (nothing sharded)")
      ->check(CLI::IsMember({"zero3", "zero2", "allreduce"}))->capture_default_str();
  app.add_option("--limit-all-gathers", s.limit_all_gathers, "layers gathered at once, the running one included")
      ->check(CLI::Range(1, 1 << 10))->capture_default_str();
  app.add_option("--budget-mib", s.budget_mib, "the most the trainer may hold per rank")->capture_default_str();
  app.add_option("--log-every", s.log_every, "steps between progress lines (0: none)")->capture_default_str();
  app.add_option("--limit-train", s.limit_train, "train on the first N samples only (0: all)")->capture_default_str();
  app.add_option("--seed", s.seed, "initialisation and shuffling")->capture_default_str();
  app.add_option("--min-accuracy", s.min_accuracy, "exit 3 below this final test accuracy")->capture_default_str();
  app.add_option("--json", s.json, "write a summary here (rank 0)");
  CLI11_PARSE(app, argc, argv);
  try {
    return s.precision == "bf16" ? train<dtrain::bfloat16>(s) : train<float>(s);
  } catch (const over_budget_error& e) {
    std::fprintf(stderr, "sharded_mlp: rank %d stops: over the budget\n", e.rank);
    return over_budget;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sharded_mlp: %s\n", e.what());
    return 1;
  }
}
