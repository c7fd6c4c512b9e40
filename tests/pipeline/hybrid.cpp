// Data x pipeline x tensor parallelism on a mesh({dp, pp, tp}) of in-process ranks: a pipeline of
// tensor-parallel stages (MLP blocks split over the tp group), replicated dp times, trained under
// 1F1B and interleaved 1F1B, equals the unsplit network trained serially on the same
// micro-batches, each rank holding its slices (within 1e-12 relative: the row-parallel sums and
// the replicas' average add in another order than the serial loops).

#include <atomic>
#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "../catch.hpp"
#include "dtrain/collective/communicator.hpp"
#include "dtrain/pipeline/partition.hpp"
#include "dtrain/pipeline/trainer.hpp"
#include "dtrain/topology/mesh.hpp"
#include "dtrain/transport/group.hpp"
#include "dtrain/transport/inproc.hpp"
#include "dtrain/updater/adam.hpp"
#include "hybrid_case.hpp"

using namespace dtrain;
namespace tp = dtrain::tensor_parallel;
using group = process_group<inproc_transport>;

namespace {

template <class Schedule>
void check_hybrid(const Schedule& schedule, int dp, int pp, int tpn, int m) {
  std::atomic<int> wrong{0}, ran{0};
  std::string first;
  std::mutex mu;
  std::vector<testing::hybrid_result> got(static_cast<std::size_t>(dp * pp * tpn));  // [(d * pp + s) * tpn + t]
  run_inproc(dp * pp * tpn, [&](int, inproc_transport t) {
    device_mesh<inproc_transport> mesh(group(std::move(t)), {{"dp", dp}, {"pp", pp}, {"tp", tpn}});
    testing::hybrid_result mine = testing::hybrid_case(mesh, schedule, dp, pp, tpn, m);
    ++ran;
    if (!mine.first.empty()) {
      ++wrong;
      std::lock_guard lock(mu);
      if (first.empty()) first = mine.first;
    }
    got[static_cast<std::size_t>((mesh.coordinate("dp") * pp + mesh.coordinate("pp")) * tpn + mesh.coordinate("tp"))] =
        std::move(mine);
  });
  INFO(Schedule::name << " dp " << dp << " pp " << pp << " tp " << tpn << " m " << m << ": " << first);
  CHECK(wrong.load() == 0);
  CHECK(ran.load() == dp * pp * tpn);
  // Bit for bit: each rank against replica 0's rank at its {pp, tp}, and its whole fc2 biases
  // against tp rank 0's of its pipeline rank.
  const auto n = static_cast<std::size_t>(pp * tpn), tps = static_cast<std::size_t>(tpn);
  for (const auto& g : got) REQUIRE((!g.bits.empty() && !g.whole.empty()));
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("replica " << i / n << ", pipeline rank " << i % n / tps << ", tp rank " << i % tps);
    CHECK(got[i].bits == got[i % n].bits);
    CHECK(got[i].whole == got[i - i % tps].whole);
  }
}

}  // namespace

TEST_CASE("hybrid: data x pipeline x tensor parallel equals serial training of the unsplit network",
          "[pipeline][hybrid]") {
  for (int m : {1, 3, 4}) {
    check_hybrid(pipeline::one_f_one_b{}, 1, 1, 3, m);
    check_hybrid(pipeline::one_f_one_b{}, 1, 2, 2, m);
    check_hybrid(pipeline::one_f_one_b{}, 2, 2, 2, m);
    check_hybrid(pipeline::one_f_one_b{}, 2, 4, 1, m);
    check_hybrid(pipeline::interleaved_one_f_one_b{2}, 2, 2, 2, m);
    check_hybrid(pipeline::gpipe{}, 3, 1, 2, m);
  }
}
