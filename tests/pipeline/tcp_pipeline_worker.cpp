// One rank of the multi-process pipeline test, started by dtrain-run: every schedule over real
// sockets, against the serial reference, with the whole world as one pipeline (m = 1..16); then,
// on an even world, 2 data-parallel replicas of a pipeline of P/2 stages (a device mesh),
// gradients averaged over the replicas; and on 4 ranks, a pipeline of 2 tensor-parallel stages
// (mesh {pp 2, tp 2}) against the unsplit network.
//
// Exit status: 0 every rank correct, 1 some rank saw a wrong parameter (every rank's verdict is
// summed across the world, so every rank exits 1), 3 a dtrain::error (printed).
//
// `tcp_pipeline_worker misfit`: the last stage is built one layer off its neighbour's seam; every
// rank must then raise `invalid_argument` naming the seam (the last stage finds it and tells the
// others), exit status 0 on a rank that did, 1 on one that did not.

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

#include "dtrain/collective/communicator.hpp"
#include "dtrain/topology/mesh.hpp"
#include "dtrain/transport/group.hpp"
#include "dtrain/transport/tcp.hpp"
#include "dtrain/updater/adam.hpp"
#include "dtrain/updater/sgd.hpp"
#include "hybrid_case.hpp"
#include "pipeline_case.hpp"

using namespace dtrain;
using group = process_group<tcp_transport>;

namespace {

int cases = 0;

// Whether every rank of `g` holds the same `bits` (each rank's parameters, raw; the same size on
// every rank): all of them gathered, every rank comparing. Collective over `g`.
bool same_on_every_rank(const group& g, const std::vector<std::byte>& bits, const char* what) {
  const std::size_t n = bits.size();
  if (n == 0) {
    std::fprintf(stderr, "WRONG (%s): nothing to compare\n", what);
    return false;
  }
  std::vector<std::byte> all(n * static_cast<std::size_t>(g.size()));
  communicator<group>(g).allgather<std::byte>(bits, all);
  for (int r = 0; r < g.size(); ++r) {
    if (std::equal(bits.begin(), bits.end(),
                   all.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * n)))
      continue;
    std::fprintf(stderr, "WRONG (%s): rank %d of its group holds other bits than this rank\n", what, r);
    return false;
  }
  return true;
}

int count(const testing::case_result& r, const char* what) {
  ++cases;
  if (r.wrong > 0) std::fprintf(stderr, "WRONG (%s): %d parameters, first %s\n", what, r.wrong, r.first.c_str());
  return r.wrong;
}

int whole_world_pipelines(group& world) {
  int wrong = 0;
  for (int m : {1, 2, 5, 8, 16}) {
    wrong += count(testing::run_pipeline_case(world, pipeline::gpipe{}, sgd<double>(0.1), m, 2), "gpipe");
    wrong += count(testing::run_pipeline_case(world, pipeline::one_f_one_b{}, adam<double>(0.01), m, 2), "1f1b");
    wrong += count(testing::run_pipeline_case(world, pipeline::interleaved_one_f_one_b{2}, sgd<double>(0.1), m, 2),
                   "interleaved");
    wrong += count(testing::run_pipeline_case(world, pipeline::pipedream{}, adam<double>(0.01), m, 2), "pipedream");
  }
  return wrong;
}

int replicated_pipelines(group& world) {
  if (world.size() % 2 != 0) return 0;
  device_mesh<tcp_transport> mesh(world, {{"dp", 2}, {"pp", world.size() / 2}});
  int wrong = 0;
  for (int m : {1, 3, 8}) {
    const testing::case_result r =
        testing::run_pipeline_case(mesh.group("pp"), pipeline::one_f_one_b{}, adam<double>(0.01), m, 2,
                                   communicator<group>(mesh.group("dp")), mesh.coordinate("dp"));
    wrong += count(r, "2 replicas of 1f1b");
    wrong += !same_on_every_rank(mesh.group("dp"), r.bits, "2 replicas of 1f1b, replicas' bits");
  }
  return wrong;
}

// The hybrid's tensor-parallel half over real sockets: 2 stages of MLP blocks, each split over 2
// ranks, compared with the unsplit network trained serially (tests/pipeline/hybrid_case.hpp).
int tensor_parallel_pipelines(group& world) {
  if (world.size() != 4) return 0;
  device_mesh<tcp_transport> mesh(world, {{"dp", 1}, {"pp", 2}, {"tp", 2}});
  int wrong = 0;
  for (int m : {1, 4}) {
    ++cases;
    const testing::hybrid_result r = testing::hybrid_case(mesh, pipeline::one_f_one_b{}, 1, 2, 2, m);
    if (!r.first.empty()) {
      std::fprintf(stderr, "WRONG (pp 2 x tp 2, m %d): %s\n", m, r.first.c_str());
      ++wrong;
    }
    wrong += !same_on_every_rank(mesh.group("tp"), r.whole, "pp 2 x tp 2, fc2 biases' bits");
  }
  return wrong;
}

// The pipeline with the last stage's first layer one early: only that stage can see the seam.
int misfit(group& world) {
  auto bounds = pipeline::uniform_partition(testing::test_widths().size() - 1, world.size());
  const int r = world.rank();
  const auto at = static_cast<std::size_t>(r);
  const int first = r == world.size() - 1 ? bounds[at] - 1 : bounds[at];
  std::vector<testing::mlp_stage<double>> chunk;
  chunk.emplace_back(testing::test_widths(), first, bounds[at + 1], testing::test_batch);
  pipeline::trainer_options o;
  o.executor.timeout = std::chrono::seconds(60);  // told at once, or this deadline says it was not
  try {
    pipeline::trainer<group, pipeline::one_f_one_b, sgd<double>, testing::mlp_stage<double>> t(
        world, std::move(chunk), sgd<double>(0.1), {}, o);
    t.step();
    std::printf("misfit: rank %d trained on: WRONG\n", r);
  } catch (const dtrain::error& e) {
    const bool told = e.code() == errc::invalid_argument &&
                      std::string(e.what()).find("disagree on the activation between them") != std::string::npos;
    std::printf("misfit: rank %d %s [%s]: %s\n", r, told ? "told" : "NOT TOLD", e.code().message().c_str(), e.what());
    return told ? 0 : 1;
  }
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc > 1 && std::string(argv[1]) == "misfit") {
      tcp_options o;
      o.timeout = std::chrono::seconds(60);
      group world(tcp_transport::from_environment(o));
      return misfit(world);
    }
    tcp_options o;
    o.timeout = std::chrono::seconds(120);
    group world(tcp_transport::from_environment(o));
    const int wrong = whole_world_pipelines(world) + replicated_pipelines(world) + tensor_parallel_pipelines(world);
    int wrong_ranks = wrong > 0 ? 1 : 0;
    communicator<group>(world).allreduce(std::span(&wrong_ranks, 1), reduce_op::sum);
    std::printf("pipeline: rank %d ran %d cases, %s; %s\n", world.rank(), cases, wrong > 0 ? "WRONG" : "correct",
                wrong_ranks == 0 ? "all ranks correct" : "WRONG RESULTS on some rank");
    return wrong_ranks == 0 && cases > 0 ? 0 : 1;
  } catch (const dtrain::error& e) {
    std::printf("caught dtrain::error [%s]: %s\n", e.code().message().c_str(), e.what());
    return 3;
  }
}
