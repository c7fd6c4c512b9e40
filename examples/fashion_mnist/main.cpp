// Fashion-MNIST with dtrain's allreduce trainer: an MLP (784-256-128-10 by default) trained by
// synchronous data-parallel SGD with momentum, each rank a process; shared memory joins the ranks
// of one host and TCP the hosts (--transport picks either alone).
//
//   dtrain-run -n 2 ./fashion_mnist                     # 2 local processes
//   ./fashion_mnist --epochs 5 --schedule constant       # the benchmark recipe, one process
//   DTRAIN_TRACE=/tmp/fm dtrain-run -n 2 ./fashion_mnist --epochs 1   # + a Perfetto timeline
//
// Each rank trains on its shard of every epoch's shuffled training set (global batch split
// evenly), evaluates its share of the test set, and rank 0 prints progress and a summary.

// settings.hpp holds the command line's settings; ps_training.hpp the parameter-server trainer.

#include <chrono>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <dtrain/updater/lr_schedule.hpp>
#include <dtrain/allreduce/trainer.hpp>
#include <dtrain/collective/communicator.hpp>
#include <dtrain/data/sampler.hpp>
#include <dtrain/transport/mixed.hpp>
#include <dtrain/transport/shm.hpp>
#include <dtrain/transport/tcp.hpp>

#include "dataset.hpp"
#include "mlp.hpp"
#include "ps_training.hpp"
#include "settings.hpp"

using namespace example;

namespace {

template <class Transport>
int run_allreduce(const settings& s) {
  auto transport = Transport::from_environment();
  const int rank = transport.rank(), ranks = transport.size();
  const auto P = static_cast<std::size_t>(ranks);
  if (s.global_batch % P != 0) {
    throw dtrain::error(dtrain::errc::invalid_argument, fmt::format("--batch {} does not split evenly across {} ranks",
                                                                    s.global_batch, ranks));
  }
  const std::size_t local_batch = s.global_batch / P;
  const auto train = fashion_mnist::load(s.data, "train");
  const auto test = fashion_mnist::load(s.data, "t10k");
  const std::size_t train_samples = s.limit_train > 0 ? std::min(s.limit_train, train.size()) : train.size();
  const auto widths = layer_widths(s);
  fashion_mnist::mlp model(widths, train, s.seed);

  dtrain::data::distributed_sampler sampler(train_samples, rank, ranks, s.seed);
  const std::size_t steps_per_epoch = sampler.shard_size() / local_batch;
  dtrain::allreduce::trainer_options options;
  options.first_bucket_bytes = static_cast<std::size_t>(s.first_bucket_kib * 1024);
  options.bucket_bytes = static_cast<std::size_t>(s.bucket_mib * 1024 * 1024);
  options.compress = s.compress == "fp16"   ? dtrain::allreduce::compression::fp16
                     : s.compress == "bf16" ? dtrain::allreduce::compression::bf16
                     : s.compress == "topk" ? dtrain::allreduce::compression::topk
                                            : dtrain::allreduce::compression::none;
  options.topk_density = s.density;
  options.average_every = s.local_sgd;
  options.local_sgd_after = s.local_sgd_after;
  options.overlap = !s.no_overlap;
  dtrain::lr_schedule schedule{s.lr, 1.0,
                               static_cast<std::size_t>(s.warmup_epochs * static_cast<double>(steps_per_epoch)),
                               s.schedule == "cosine" ? steps_per_epoch * s.epochs : 0, 0.0};
  options.learning_rate = schedule;

  using collective = dtrain::communicator<Transport>;
  dtrain::allreduce::trainer trainer(collective(std::move(transport)), dtrain::momentum<float>(s.lr, s.momentum),
                                     model, options);
  if (rank == 0) {
    fmt::print("fashion_mnist: {} rank(s), MLP {}, {} training samples, global batch {} ({} per rank), {} steps "
               "per epoch, lr {} {} momentum {}, buckets: {}\n",
               ranks, fmt::join(widths, "-"), train_samples, s.global_batch, local_batch, steps_per_epoch, s.lr,
               s.schedule, s.momentum, trainer.plan().summary());
  }

  // The test set is split across ranks for evaluation and the counts summed.
  double test_loss = 0;
  auto evaluate = [&] {
    const std::size_t share = (test.size() + P - 1) / P;
    const std::size_t first = std::min(test.size(), share * static_cast<std::size_t>(rank));
    const std::size_t last = std::min(test.size(), first + share);
    std::vector<double> sums{0.0, 0.0};  // correct, loss
    for (std::size_t at = first; at < last; at += 1000) {
      const auto [hits, loss] = model.evaluate(test, at, std::min<std::size_t>(1000, last - at));
      sums[0] += static_cast<double>(hits);
      sums[1] += loss;
    }
    trainer.sum_across_ranks(std::span(sums));
    test_loss = sums[1] / static_cast<double>(test.size());
    return sums[0] / static_cast<double>(test.size());
  };

  double train_seconds = 0, accuracy = 0;
  std::vector<double> epoch_seconds;
  std::vector<std::pair<double, double>> curve;  // (training seconds, test accuracy)
  auto stats_before = trainer.stats();
  double comm_share = 0;
  std::size_t total_steps = 0;
  bool out_of_time = false;
  for (int epoch = 0; epoch < s.epochs && !out_of_time; ++epoch) {
    const auto order = sampler.indices(static_cast<std::uint64_t>(epoch));
    const auto start = clock_type::now();
    auto window_start = start;
    std::vector<double> window{0.0, 0.0};  // loss sum, steps
    double epoch_loss = 0;
    std::size_t steps_done = 0;
    for (std::size_t step = 0; step < steps_per_epoch; ++step) {
      const auto result = trainer.step(std::span(order).subspan(step * local_batch, local_batch));
      ++total_steps;
      ++steps_done;
      if (s.time_budget > 0 && (step + 1) % 20 == 0) {  // every rank stops at the same step
        std::vector<double> over{train_seconds + since(start) >= s.time_budget ? 1.0 : 0.0};
        trainer.sum_across_ranks(std::span(over));
        if (over[0] > 0) {
          out_of_time = true;
          epoch_loss += result.loss;
          break;
        }
      }
      window[0] += result.loss;
      window[1] += 1;
      epoch_loss += result.loss;
      if (s.log_every > 0 && (step + 1) % s.log_every == 0) {
        trainer.sum_across_ranks(std::span(window));
        if (rank == 0) {
          fmt::print("epoch {:>2}  step {:>6}  loss {:.4f}  lr {:.4f}  samples/s {:>8.0f}\n", epoch + 1,
                     trainer.steps(), window[0] / window[1], result.learning_rate,
                     window[1] / static_cast<double>(P) * static_cast<double>(s.global_batch) / since(window_start));
        }
        window = {0.0, 0.0};
        window_start = clock_type::now();
      }
    }
    const double seconds = since(start);
    train_seconds += seconds;
    epoch_seconds.push_back(seconds);
    std::vector<double> loss{epoch_loss / static_cast<double>(steps_done)};
    trainer.sum_across_ranks(std::span(loss));
    accuracy = evaluate();
    curve.emplace_back(train_seconds, accuracy);
    const auto& st = trainer.stats();
    comm_share = (st.wait_seconds - stats_before.wait_seconds) / (st.step_seconds - stats_before.step_seconds);
    stats_before = st;
    if (rank == 0) {
      fmt::print("epoch {:>2}/{}  train loss {:.4f}  test accuracy {:.4f}  {:.2f} s  {:.0f} samples/s  "
                 "communication {:.1f}% of a step\n",
                 epoch + 1, s.epochs, loss[0] / static_cast<double>(P), accuracy, seconds,
                 static_cast<double>(steps_done * s.global_batch) / seconds, 100 * comm_share);
    }
  }
  const double samples_per_second =
      static_cast<double>(total_steps * s.global_batch) / train_seconds;
  if (rank == 0) {
    const double bytes_per_step =
        static_cast<double>(trainer.stats().bytes_reduced) / static_cast<double>(std::max<std::size_t>(1, total_steps));
    fmt::print("final test accuracy {:.4f}; {:.0f} samples/s over {} epochs on {} rank(s); {:.0f} bytes a step "
               "handed to collectives per rank; parameters digest {}\n", accuracy, samples_per_second,
               epoch_seconds.size(), ranks, bytes_per_step, digest_of(model.flat_parameters()));
    write_summary(s, "dtrain", ranks, samples_per_second, epoch_seconds, comm_share, accuracy, curve, test_loss,
                  bytes_per_step);
  }
  return accuracy >= s.min_accuracy ? 0 : 3;
}

}  // namespace


int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress shows as it happens, through dtrain-run's pipes too
  settings s;
  CLI::App app{
      "Fashion-MNIST MLP trained with dtrain's allreduce trainer or parameter server (launch with dtrain-run)"};
  app.add_option("--data", s.data, "directory of the IDX files (.gz or plain)")->capture_default_str();
  app.add_option("--epochs", s.epochs, "passes over the training set")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--batch", s.global_batch, "global batch (split across ranks)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--lr", s.lr, "learning rate")->capture_default_str();
  app.add_option("--momentum", s.momentum, "momentum")->capture_default_str();
  app.add_option("--schedule", s.schedule, "learning-rate schedule after warm-up")
      ->check(CLI::IsMember({"constant", "cosine"}))->capture_default_str();
  app.add_option("--warmup-epochs", s.warmup_epochs, "linear warm-up from the base rate")->capture_default_str();
  app.add_option("--hidden", s.hidden, "hidden layer widths")->delimiter(',')->capture_default_str();
  app.add_option("--compress", s.compress, "gradient compression on the wire")
      ->check(CLI::IsMember({"none", "fp16", "bf16", "topk"}))->capture_default_str();
  app.add_option("--density", s.density,
                 "top-k: share of each bucket's entries a rank sends (error feedback keeps the rest)")
      ->check(CLI::Range(1e-6, 1.0))
      ->capture_default_str();
  app.add_option("--local-sgd", s.local_sgd, "average parameters every TAU steps instead of gradients every step")
      ->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--local-sgd-after", s.local_sgd_after, "synchronous steps before local SGD starts")
      ->capture_default_str();
  app.add_option("--first-bucket-kib", s.first_bucket_kib,
                 "first gradient bucket (0: 1 MiB, or an eighth of the model where every rank has cores to spare)")
      ->capture_default_str();
  app.add_option("--bucket-mib", s.bucket_mib, "other gradient buckets")->capture_default_str();
  app.add_flag("--no-overlap", s.no_overlap, "allreduce after the backward pass instead of during it");
  app.add_option("--log-every", s.log_every, "steps between progress lines (0: none)")->capture_default_str();
  app.add_option("--limit-train", s.limit_train, "use only the first N training samples (0: all)");
  app.add_option("--seed", s.seed, "initialisation and shuffling seed")->capture_default_str();
  app.add_option("--json", s.json, "write a summary as JSON (rank 0)");
  app.add_option("--min-accuracy", s.min_accuracy, "exit with status 3 below this test accuracy");
  app.add_option("--transport", s.transport,
                 "auto (shared memory to ranks on this host, TCP to others), tcp, or shm (every rank on this host)")
      ->check(CLI::IsMember({"auto", "tcp", "shm"}))->capture_default_str();
  app.add_option("--trainer", s.trainer, "allreduce, or ps (parameter server: DTRAIN_PS_SERVERS first ranks serve)")
      ->check(CLI::IsMember({"allreduce", "ps"}))->capture_default_str();
  app.add_option("--consistency", s.consistency, "parameter server: consistency model")
      ->check(CLI::IsMember({"bsp", "asp", "ssp1", "ssp4", "soft2"}))->capture_default_str();
  app.add_option("--algorithm", s.algorithm, "parameter server: worker algorithm")
      ->check(CLI::IsMember({"sync", "downpour", "adag", "easgd", "averaging", "dynsgd"}))->capture_default_str();
  app.add_option("--tau", s.tau, "parameter server: the period of ADAG, EASGD, averaging; DynSGD's window")
      ->capture_default_str();
  app.add_option("--rho", s.rho, "parameter server: EASGD's elasticity (alpha = lr * rho)")->capture_default_str();
  app.add_option("--replicas", s.replicas, "parameter server: copies of each shard, on as many servers")
      ->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--slice-kib", s.slice_kib,
                 "parameter server: the parameters are cut into slices of this size, spread over the shards")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 20))->capture_default_str();
  app.add_option("--time-budget", s.time_budget, "stop training after this many seconds")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    if (s.trainer == "ps") return run_ps(s);
    if (s.transport == "shm") return run_allreduce<dtrain::shm_transport>(s);
    if (s.transport == "tcp") return run_allreduce<dtrain::tcp_transport>(s);
    return run_allreduce<dtrain::mixed_transport>(s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    return 1;
  }
}
