// One rank of the allreduce trainer across real processes over TCP (started by dtrain-run):
// trains the test model, gathers every rank's final weights, and compares them with the serial
// simulation. Exit status 0 when every replica matches, 1 otherwise.
//
//   trainer_worker sync        gradients averaged every step, small buckets, per-rank ready order
//   trainer_worker local-sgd   local SGD, tau = 4 after 3 synchronous steps

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "dtrain/allreduce/trainer.hpp"
#include "dtrain/collective/communicator.hpp"
#include "dtrain/transport/tcp.hpp"
#include "dtrain/updater/momentum.hpp"
#include "linear_model.hpp"
#include "simulation.hpp"

using namespace dtrain;
using namespace dtrain::testing;

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "sync";
  try {
    tuned<tcp_transport> comm(tcp_transport::from_environment());
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
