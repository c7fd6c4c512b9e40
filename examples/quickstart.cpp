// Data-parallel training in a few lines: each rank (a thread here) owns a shard of a linear
// regression problem, computes its gradient, averages it across ranks with an allreduce, and
// applies the same momentum step. Since every rank applies the same averaged gradient to the same
// starting weights, the replicas stay identical, which the program checks at the end.
//
//   quickstart --ranks 4 --epochs 5

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <dtrain/dtrain.hpp>

int main(int argc, char** argv) {
  int ranks = 4, epochs = 5, features = 64;
  std::size_t samples_per_rank = 4096, batch = 32;
  double lr = 0.01;
  CLI::App app{"dtrain quickstart: data-parallel linear regression over in-process ranks"};
  app.add_option("-n,--ranks", ranks, "ranks (threads)")->check(CLI::Range(1, 64));
  app.add_option("--epochs", epochs, "passes over each shard")->check(CLI::Range(1, 10000));
  app.add_option("--features", features, "model size")->check(CLI::Range(1, 100000));
  app.add_option("--samples", samples_per_rank, "samples per rank");
  app.add_option("--batch", batch, "samples per rank per step")->check(CLI::Range(1, 1 << 20));
  app.add_option("--lr", lr, "learning rate");
  CLI11_PARSE(app, argc, argv);

  // The true model the data comes from, so the result can be checked.
  std::mt19937 gen(42);
  std::normal_distribution<double> normal;
  std::vector<double> truth(static_cast<std::size_t>(features));
  for (double& w : truth) w = normal(gen);

  // The trainer's parts: a transport, a collective over it, an updater.
  using collective = dtrain::communicator<dtrain::inproc_transport>;
  using updater = dtrain::momentum<double>;

  std::vector<std::vector<double>> final_weights(static_cast<std::size_t>(ranks));
  dtrain::run_inproc(ranks, [&](int r, dtrain::inproc_transport endpoint) {  // a thread per rank
    collective comm(std::move(endpoint));
    updater opt(lr, 0.9);
    const auto d = static_cast<std::size_t>(features);
    // This rank's shard: x ~ N(0, 1), y = x . truth + noise.
    std::mt19937 local(static_cast<unsigned>(1000 + r));
    std::normal_distribution<double> n01;
    std::vector<double> x(samples_per_rank * d), y(samples_per_rank);
    for (std::size_t s = 0; s < samples_per_rank; ++s) {
      double dot = 0;
      for (std::size_t j = 0; j < d; ++j) dot += (x[s * d + j] = n01(local)) * truth[j];
      y[s] = dot + 0.01 * n01(local);
    }
    std::vector<double> w(d, 0.0), grad(d);
    opt.resize(d);
    comm.broadcast(std::span(w), 0);  // every replica starts from rank 0's weights
    for (int epoch = 1; epoch <= epochs; ++epoch) {
      double epoch_loss = 0;
      std::size_t steps = 0;
      for (std::size_t begin = 0; begin + batch <= samples_per_rank; begin += batch, ++steps) {
        std::fill(grad.begin(), grad.end(), 0.0);
        std::vector<double> loss{0.0};
        for (std::size_t s = begin; s < begin + batch; ++s) {
          double err = -y[s];
          for (std::size_t j = 0; j < d; ++j) err += x[s * d + j] * w[j];
          loss[0] += 0.5 * err * err / static_cast<double>(batch);
          for (std::size_t j = 0; j < d; ++j) grad[j] += err * x[s * d + j] / static_cast<double>(batch);
        }
        comm.allreduce(std::span(grad), dtrain::reduce_op::avg);  // the data-parallel step
        comm.allreduce(std::span(loss), dtrain::reduce_op::avg);
        opt.step(std::span(w), std::span<const double>(grad), 0, {});
        epoch_loss += loss[0];
      }
      if (r == 0) {
        fmt::print("epoch {:>3}  steps {:>5}  mean loss {:.6f}\n", epoch, steps * static_cast<std::size_t>(epoch),
                   epoch_loss / static_cast<double>(steps));
      }
    }
    final_weights[static_cast<std::size_t>(r)] = w;
  });

  double err = 0;
  for (std::size_t j = 0; j < truth.size(); ++j) err = std::max(err, std::fabs(final_weights[0][j] - truth[j]));
  bool replicas_equal = true;
  for (const auto& w : final_weights) replicas_equal = replicas_equal && w == final_weights[0];
  fmt::print("{} ranks: max |w - w_true| = {:.2e}; replicas identical: {}\n", ranks, err,
             replicas_equal ? "yes" : "NO");
  return replicas_equal && err < 0.05 ? 0 : 1;
}
