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
#include "dtrain/transport/group.hpp"
#include "dtrain/transport/inproc.hpp"
#include "dtrain/transport/mesh.hpp"
#include "dtrain/updater/adam.hpp"
#include "reference.hpp"
#include "tp_stage.hpp"

using namespace dtrain;
namespace tp = dtrain::tensor_parallel;
using group = process_group<inproc_transport>;

namespace {

constexpr int batch = 2;

// The unsplit network after `steps` serial steps of `micro_batches` micro-batches: its tensors
// (4 per block) in order.
std::vector<std::vector<double>> serial_blocks(int micro_batches, int steps) {
  std::vector<std::vector<double>> tensors;
  run_inproc(1, [&](int, inproc_transport t) {
    communicator<inproc_transport> alone(std::move(t));
    const testing::block_network net;
    testing::tp_mlp_stage<communicator<inproc_transport>> whole(alone, net, 0, net.blocks(), batch);
    adam<double> u(0.01);
    std::size_t n = 0;
    for (std::size_t i = 0; i < whole.tensor_count(); ++i) n += whole.parameters(i).size();
    u.resize(n);
    for (int s = 0; s < steps; ++s) {
      for (int i = 0; i < micro_batches; ++i) {
        const micro_batch mb{static_cast<std::uint64_t>(s), i, micro_batches};
        whole.forward(mb, {}, {});
        whole.backward(mb, {}, {});
      }
      testing::update_and_zero(whole, u, 1.0 / micro_batches);
    }
    for (std::size_t i = 0; i < whole.tensor_count(); ++i) {
      auto p = whole.parameters(i);
      tensors.emplace_back(p.begin(), p.end());
    }
  });
  return tensors;
}

// Tensor k of block b, as tensor-parallel rank `r` of `ranks` holds it.
std::vector<double> slice_of_tensor(const std::vector<double>& whole, int b, int k, int r, int ranks) {
  const testing::block_network net;
  const auto in = static_cast<std::size_t>(net.dims[b]), h = static_cast<std::size_t>(net.hidden[b]);
  const tp::slice s = tp::slice_of(h, r, ranks);
  std::vector<double> out;
  if (k == 0) out.assign(whole.begin() + s.begin * in, whole.begin() + (s.begin + s.size) * in);  // fc1 rows
  if (k == 1) out.assign(whole.begin() + s.begin, whole.begin() + s.begin + s.size);            // fc1 bias
  if (k == 2) {                                                                                   // fc2 columns
    for (std::size_t o = 0; o < whole.size() / h; ++o) out.insert(out.end(), whole.begin() + o * h + s.begin, whole.begin() + o * h + s.begin + s.size);
  }
  if (k == 3) out = whole;  // fc2 bias, whole on every rank
  return out;
}

template <class Schedule>
void check_hybrid(const Schedule& schedule, int dp, int pp, int tpn, int m) {
  const int steps = 3;
  const auto want = serial_blocks(m * dp, steps);
  std::atomic<int> wrong{0}, compared{0};
  std::string first;
  std::mutex mu;
  run_inproc(dp * pp * tpn, [&](int, inproc_transport t) {
    device_mesh<inproc_transport> mesh(group(std::move(t)), {{"dp", dp}, {"pp", pp}, {"tp", tpn}});
    using tp_comm = communicator<group>;
    tp_comm tensor_group(mesh.group("tp"));
    const testing::block_network net;
    const int v = schedule.chunks(), stage_rank = mesh.coordinate("pp");
    const auto bounds = pipeline::uniform_partition(static_cast<std::size_t>(net.blocks()), pp * v);
    std::vector<testing::tp_mlp_stage<tp_comm>> chunks;
    for (int c = 0; c < v; ++c) {
      const int s = c * pp + stage_rank;
      chunks.emplace_back(tensor_group, net, bounds[s], bounds[s + 1], batch, mesh.coordinate("dp"), dp);
    }
    pipeline::trainer_options o;
    o.micro_batches = m;
    pipeline::trainer<group, Schedule, adam<double>, testing::tp_mlp_stage<tp_comm>, tp_comm> trainer(
        mesh.group("pp"), std::move(chunks), adam<double>(0.01), schedule, o, tp_comm(mesh.group("dp")));
    for (int i = 0; i < steps; ++i) trainer.step();
    for (int c = 0; c < v; ++c) {
      const int s = c * pp + stage_rank;
      auto& stage = trainer.chunks()[c];
      for (std::size_t i = 0; i < stage.tensor_count(); ++i) {
        const int b = bounds[s] + static_cast<int>(i / 4);
        const auto expect = slice_of_tensor(want[4 * static_cast<std::size_t>(b) + i % 4], b, static_cast<int>(i % 4),
                                            mesh.coordinate("tp"), tpn);
        const auto got = stage.parameters(i);
        ++compared;
        bool same = got.size() == expect.size();
        for (std::size_t k = 0; same && k < got.size(); ++k) same = std::abs(got[k] - expect[k]) <= 1e-12 * std::max(1.0, std::abs(expect[k]));
        if (same) continue;
        ++wrong;
        std::lock_guard lock(mu);
        if (first.empty()) first = "block " + std::to_string(b) + " tensor " + std::to_string(i % 4);
      }
    }
  });
  INFO(Schedule::name << " dp " << dp << " pp " << pp << " tp " << tpn << " m " << m << ": " << first);
  CHECK(wrong.load() == 0);
  CHECK(compared.load() >= 16);
}

}  // namespace

TEST_CASE("hybrid: data x pipeline x tensor parallel equals serial training of the unsplit network", "[pipeline][hybrid]") {
  for (int m : {1, 3, 4}) {
    check_hybrid(pipeline::one_f_one_b{}, 1, 1, 3, m);
    check_hybrid(pipeline::one_f_one_b{}, 1, 2, 2, m);
    check_hybrid(pipeline::one_f_one_b{}, 2, 2, 2, m);
    check_hybrid(pipeline::one_f_one_b{}, 2, 4, 1, m);
    check_hybrid(pipeline::interleaved_one_f_one_b{2}, 2, 2, 2, m);
    check_hybrid(pipeline::gpipe{}, 3, 1, 2, m);
  }
}
