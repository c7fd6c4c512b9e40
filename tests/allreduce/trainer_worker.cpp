// One rank of the allreduce trainer across real processes over TCP (started by dtrain-run):
// trains the test model, gathers every rank's final weights, and compares them with the serial
// simulation. Exit status 0 when every replica matches, 1 otherwise.
//
//   trainer_worker sync        gradients averaged every step, small buckets, per-rank ready order
//   trainer_worker local-sgd   local SGD, tau = 4 after 3 synchronous steps
//   trainer_worker resume      Adam, 30 steps straight; and 13 steps, a checkpoint per rank, a
//                              fresh model and trainer that load it and finish: bit-identical
//   trainer_worker bf16        a bfloat16 model, float master weights and Adam, averaged in float,
//                              against the serial mixed-precision simulation (within bfloat16's
//                              spacing)

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "dtrain/allreduce/trainer.hpp"
#include "dtrain/collective/communicator.hpp"
#include "dtrain/transport/group.hpp"
#include "dtrain/transport/tcp.hpp"
#include "dtrain/updater/adam.hpp"
#include "dtrain/updater/momentum.hpp"
#include "../sharded/mixed_models.hpp"
#include "linear_model.hpp"
#include "simulation.hpp"

using namespace dtrain;
using namespace dtrain::testing;

namespace {

// Steps [first, last) of the job; batches at (step * batch) % 400 of this rank's data.
template <class Trainer>
void run_steps(Trainer& tr, std::size_t first, std::size_t last) {
  for (std::size_t k = first; k < last; ++k) {
    const std::size_t begin = (k * batch) % 400;
    tr.step({begin, begin + batch});
  }
}

// The same job straight and resumed from a mid-epoch checkpoint, each on its own group of the
// same processes: every rank's final weights must be equal bit for bit.
int resume() {
  using group = process_group<tcp_transport>;
  group world(tcp_transport::from_environment());
  const int rank = world.rank(), ranks = world.size();
  auto all = [&](const char* label) { return *world.form(rank_list::range(0, ranks), label); };
  auto data = data_of(rank);
  allreduce::trainer_options o;
  o.first_bucket_bytes = 8 * 10;
  o.bucket_bytes = 8 * 64;
  o.learning_rate = [](std::size_t step) { return 0.02 / (1.0 + 0.05 * static_cast<double>(step)); };
  constexpr std::size_t steps = 30, save_at = 13;

  linear_model straight_model(tensor_sizes, data, 0.25);
  allreduce::trainer straight(communicator<group>(all("straight")), adam<double>(0.01), straight_model, o);
  run_steps(straight, 0, steps);

  const std::string path =
      "/tmp/dtrain-resume-" + std::to_string(::getppid()) + "-rank" + std::to_string(rank) + ".ckpt";
  linear_model first_model(tensor_sizes, data, 0.25);
  allreduce::trainer first(communicator<group>(all("first")), adam<double>(0.01), first_model, o);
  run_steps(first, 0, save_at);
  first.save(path, {0, save_at * batch % 400});

  linear_model resumed_model(tensor_sizes, data, -3.0);
  allreduce::trainer resumed(communicator<group>(all("resumed")), adam<double>(0.01), resumed_model, o);
  const auto at = resumed.load(path);
  std::remove(path.c_str());
  run_steps(resumed, at.next / batch, steps);

  std::vector<std::int64_t> wrong{resumed_model.weights() == straight_model.weights() && resumed.steps() == steps ? 0
                                                                                                                  : 1};
  straight.with_collective([&](auto& c) { c.allreduce(std::span(wrong), reduce_op::sum); });
  if (rank == 0) {
    std::printf(
        "trainer resume: %d ranks over TCP, checkpoint at step %zu of %zu: %lld ranks differ from the straight run\n",
        ranks, save_at, steps, static_cast<long long>(wrong[0]));
  }
  return wrong[0] == 0 ? 0 : 1;
}

// Mixed precision: every rank's weights, gathered, against the simulation's master rounded to
// bfloat16; the largest difference in units of bfloat16's relative spacing (1/128), <= 1 passes.
int bf16() {
  communicator<tcp_transport> comm(tcp_transport::from_environment());
  const int rank = comm.rank(), ranks = comm.size();
  auto data = data_of(rank);
  mixed_linear_model<bfloat16> m(data, rank == 0 ? 0.25 : 1.0 + rank);  // the root's start must win
  allreduce::trainer_options o;
  o.first_bucket_bytes = 2 * 20;
  o.bucket_bytes = 2 * 64;
  constexpr int steps = 30;
  allreduce::trainer tr(std::move(comm), adam<float>(1e-2), m, o);
  run_steps(tr, 0, steps);
  const auto mine = m.weights();
  std::vector<double> all(mine.size() * static_cast<std::size_t>(ranks));
  tr.with_collective([&](auto& c) { c.allgather(std::span<const double>(mine), std::span<double>(all)); });
  const auto want = mixed_training<bfloat16>(ranks, steps, adam<float>(1e-2)).master;
  double worst = mine.size() == want.size() ? 0 : 1e9;
  for (std::size_t i = 0; i < all.size(); ++i) {
    const double rounded = element_cast<double>(element_cast<bfloat16>(want[i % mine.size()]));
    worst = std::max(worst, std::abs(all[i] - rounded) / (std::abs(rounded) / 128 + 1e-6));
    if (all[i] != all[i % mine.size()]) worst = 1e9;  // every replica holds rank 0's bits
  }
  if (rank == 0) {
    std::printf("trainer bf16: %d ranks over TCP, %d steps: largest difference from the simulation %.3g of "
                "bfloat16's spacing\n", ranks, steps, worst);
  }
  return worst <= 1 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "sync";
  try {
    if (mode == "resume") return resume();
    if (mode == "bf16") return bf16();
    communicator<tcp_transport> comm(tcp_transport::from_environment());
    const int rank = comm.rank(), ranks = comm.size();
    auto data = data_of(rank);
    linear_model m(tensor_sizes, data, rank == 0 ? 0.25 : -1.0);
    std::mt19937 gen(static_cast<unsigned>(rank));
    std::shuffle(m.ready_order().begin(), m.ready_order().end(), gen);
    allreduce::trainer_options o;
    o.first_bucket_bytes = 8 * 10;
    o.bucket_bytes = 8 * 64;
    const std::size_t tau = mode == "local-sgd" ? 4 : 1;
    o.average_every = tau;
    o.local_sgd_after = mode == "local-sgd" ? 3 : 0;
    const int steps = 40;
    allreduce::trainer tr(std::move(comm), momentum<double>(lr, mu), m, o);
    for (int k = 0; k < steps; ++k) {
      const std::size_t begin = (static_cast<std::size_t>(k) * batch) % 400;
      tr.step({begin, begin + batch});
    }
    const auto mine = m.weights();
    std::vector<double> all(mine.size() * static_cast<std::size_t>(ranks));
    tr.with_collective([&](auto& c) { c.allgather(std::span<const double>(mine), std::span<double>(all)); });
    const auto want = simulate(ranks, steps, tau, o.local_sgd_after);
    double worst = 0;
    for (int r = 0; r < ranks; ++r) {
      for (std::size_t j = 0; j < mine.size(); ++j) {
        const double got = all[static_cast<std::size_t>(r) * mine.size() + j];
        const double ref = want[static_cast<std::size_t>(r)][j];
        worst = std::max(worst, std::fabs(got - ref) / std::max(1.0, std::fabs(ref)));
      }
    }
    const bool ok = worst < 1e-12;
    if (rank == 0) {
      std::printf("trainer %s: %d ranks over TCP, %d steps, %s the serial simulation (worst relative error %.2e)\n",
                  mode.c_str(), ranks, steps, ok ? "match" : "DO NOT match", worst);
    }
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainer_worker: %s\n", e.what());
    return 2;
  }
}
