// One rank of the sharded trainer across real processes over TCP (started by dtrain-run):
// trains the test model for 30 momentum steps and compares its weights with the serial
// simulation of every rank averaging. Exit status 0 when they match, 1 otherwise.
//
//   sharded_worker zero1 | zero2   stages 1 and 2, small buckets, per-rank ready order
//   sharded_worker zero3           stage 3 on the unit model, one unit gathered ahead
//   sharded_worker hybrid          stage 3 sharded within pairs of ranks, replicated across
//   sharded_worker bf16            stage 2, a bfloat16 model with float master weights and Adam,
//                                  against the serial mixed-precision simulation (within
//                                  bfloat16's spacing of its master, rounded)

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "../allreduce/linear_model.hpp"
#include "../allreduce/simulation.hpp"
#include "dtrain/collective/communicator.hpp"
#include "dtrain/collective/selection.hpp"
#include "dtrain/sharded/trainer.hpp"
#include "dtrain/sharded/unit_trainer.hpp"
#include "dtrain/transport/group.hpp"
#include "dtrain/transport/tcp.hpp"
#include "dtrain/updater/adam.hpp"
#include "dtrain/updater/momentum.hpp"
#include "mixed_models.hpp"
#include "unit_model.hpp"

using namespace dtrain;
using namespace dtrain::testing;
using group = process_group<tcp_transport>;
using comm_t = communicator<group>;

namespace {

constexpr int steps = 30;

template <class Trainer>
void run_steps(Trainer& tr) {
  for (int k = 0; k < steps; ++k) {
    const std::size_t begin = (static_cast<std::size_t>(k) * batch) % 400;
    tr.step({begin, begin + batch});
  }
}

template <class Trainer>
std::vector<double> gathered_units(Trainer& tr) {
  std::vector<double> w;
  for (std::size_t u = 0; u < unit_sizes.size(); ++u) {
    const auto whole = tr.unit_parameters(u);
    w.insert(w.end(), whole.begin(), whole.end());
  }
  return w;
}

template <class Stage>
std::vector<double> flat(group& world, int rank) {
  auto data = data_of(rank);
  linear_model m(tensor_sizes, data, rank == 0 ? 0.25 : 1.0 + rank);
  std::mt19937 gen(static_cast<unsigned>(rank));
  std::shuffle(m.ready_order().begin(), m.ready_order().end(), gen);
  sharded::trainer_options o;
  o.first_bucket_bytes = 8 * 10;
  o.bucket_bytes = 8 * 64;
  sharded::trainer<comm_t, Stage, momentum<double>, linear_model> tr(comm_t(world), momentum<double>(lr, mu), m, o);
  run_steps(tr);
  return m.weights();
}

std::vector<double> stage3(group& world, int rank, bool hybrid) {
  auto data = data_of(rank);
  unit_linear_model m(unit_sizes, data, rank == 0 ? 0.25 : 1.0 + rank);
  if (!hybrid) {
    sharded::trainer<comm_t, sharded::zero3, momentum<double>, unit_linear_model> tr(comm_t(world),
                                                                                     momentum<double>(lr, mu), m);
    run_steps(tr);
    return gathered_units(tr);
  }
  group pair = *world.split(rank / 2, rank), replicas = *world.split(rank % 2, rank);
  sharded::trainer<comm_t, sharded::zero3, momentum<double>, unit_linear_model, comm_t> tr(
      comm_t(pair), comm_t(replicas), momentum<double>(lr, mu), m);
  run_steps(tr);
  return gathered_units(tr);
}

// Stage 2 in mixed precision: every rank's weights against the simulation's master rounded to
// bfloat16; the largest difference in units of bfloat16's relative spacing (1/128), <= 1 passes.
double bf16(group& world, int rank, int ranks) {
  auto data = data_of(rank);
  mixed_linear_model<bfloat16> m(data, rank == 0 ? 0.25 : 1.0 + rank);  // the root's start must win
  sharded::trainer_options o;
  o.first_bucket_bytes = 2 * 20;
  o.bucket_bytes = 2 * 64;
  sharded::trainer<comm_t, sharded::zero2, adam<float>, mixed_linear_model<bfloat16>> tr(comm_t(world),
                                                                                          adam<float>(1e-2), m, o);
  run_steps(tr);
  const auto want = mixed_training<bfloat16>(ranks, steps, adam<float>(1e-2)).master;
  const auto got = m.weights();
  double worst = got.size() == want.size() ? 0 : 1e9;
  for (std::size_t j = 0; j < want.size() && j < got.size(); ++j) {
    const double rounded = element_cast<double>(element_cast<bfloat16>(want[j]));
    worst = std::max(worst, std::abs(got[j] - rounded) / (std::abs(rounded) / 128 + 1e-6));
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  group world(tcp_transport::from_environment());
  const int rank = world.rank(), ranks = world.size();
  if (mode == "bf16") {
    const double worst = bf16(world, rank, ranks);
    std::printf("rank %d of %d, bf16: largest difference from the simulation %.3g of bfloat16's spacing: %s\n", rank,
                ranks, worst, worst <= 1 ? "PASS" : "FAIL");
    return worst <= 1 ? 0 : 1;
  }
  std::vector<double> got;
  if (mode == "zero1") {
    got = flat<sharded::zero1>(world, rank);
  } else if (mode == "zero2") {
    got = flat<sharded::zero2>(world, rank);
  } else if (mode == "zero3" || mode == "hybrid") {
    got = stage3(world, rank, mode == "hybrid");
  } else {
    std::fprintf(stderr, "usage: sharded_worker zero1|zero2|zero3|hybrid|bf16\n");
    return 2;
  }
  const std::vector<double> want = simulate(ranks, steps, 1, 0)[0];
  double worst = 0;
  for (std::size_t j = 0; j < want.size() && j < got.size(); ++j) {
    worst = std::max(worst, std::abs(got[j] - want[j]) / std::max(1.0, std::abs(want[j])));
  }
  const bool ok = got.size() == want.size() && worst <= 1e-12;
  std::printf("rank %d of %d, %s: largest relative difference from the simulation %.3g: %s\n", rank, ranks,
              mode.c_str(), worst, ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
