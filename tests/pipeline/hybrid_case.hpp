#pragma once
// One rank of a hybrid case, shared by the in-process test and the TCP worker: a pipeline of
// tensor-parallel stages (MLP blocks split over the mesh's tp group), replicated over its dp
// group, trained for 3 steps and compared, slice by slice, with the unsplit network trained
// serially on every replica's micro-batches (within 1e-12 relative: the row-parallel sums and
// the replicas' average add in another order than the serial loops).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/collective/communicator.hpp"
#include "dtrain/pipeline/partition.hpp"
#include "dtrain/pipeline/trainer.hpp"
#include "dtrain/topology/mesh.hpp"
#include "dtrain/transport/group.hpp"
#include "dtrain/transport/inproc.hpp"
#include "dtrain/updater/adam.hpp"
#include "reference.hpp"
#include "tp_stage.hpp"

namespace dtrain::testing {

inline constexpr int batch = 2;

/// The unsplit network after `steps` serial steps of `micro_batches` micro-batches: its tensors
// (4 per block) in order.
inline std::vector<std::vector<double>> serial_blocks(int micro_batches, int steps) {
  std::vector<std::vector<double>> tensors;
  run_inproc(1, [&](int, inproc_transport t) {
    communicator<inproc_transport> alone(std::move(t));
    const block_network net;
    tp_mlp_stage<communicator<inproc_transport>> whole(alone, net, 0, net.blocks(), batch);
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
      update_and_zero(whole, u, 1.0 / micro_batches, static_cast<std::uint64_t>(s + 1));
    }
    for (std::size_t i = 0; i < whole.tensor_count(); ++i) {
      auto p = whole.parameters(i);
      tensors.emplace_back(p.begin(), p.end());
    }
  });
  return tensors;
}

/// Tensor k of block b, as tensor-parallel rank `r` of `ranks` holds it.
inline std::vector<double> slice_of_tensor(const std::vector<double>& whole, int b, int k, int r, int ranks) {
  const block_network net;
  const auto in = static_cast<std::size_t>(net.dims[b]), h = static_cast<std::size_t>(net.hidden[b]);
  const tensor_parallel::slice s = tensor_parallel::slice_of(h, r, ranks);
  std::vector<double> out;
  if (k == 0) out.assign(whole.begin() + s.begin * in, whole.begin() + (s.begin + s.size) * in);  // fc1 rows
  if (k == 1) out.assign(whole.begin() + s.begin, whole.begin() + s.begin + s.size);            // fc1 bias
  if (k == 2) {                                                                                   // fc2 columns
    for (std::size_t o = 0; o < whole.size() / h; ++o)
      out.insert(out.end(), whole.begin() + o * h + s.begin, whole.begin() + o * h + s.begin + s.size);
  }
  if (k == 3) out = whole;  // fc2 bias, whole on every rank
  return out;
}

/// What a rank of a hybrid case ends with.
struct hybrid_result {
  std::string first;             // "" if every slice matches the serial run, else the first that does not
  std::vector<std::byte> bits;   // every parameter, raw: the same on every replica
  std::vector<std::byte> whole;  // the fc2 biases (whole on every rank), raw: the same on every tp rank too
};

/// Trains this rank's part of a {dp, pp, tp} mesh under `schedule` for 3 steps of `m`
/// micro-batches and compares its slices with the serial run.
template <class World, class Schedule>
hybrid_result hybrid_case(device_mesh<World>& mesh, const Schedule& schedule, int dp, int pp, int tpn, int m) {
  namespace tp = dtrain::tensor_parallel;
  using group = process_group<World>;
  using tp_comm = communicator<group>;
  const int steps = 3;
  const auto want = serial_blocks(m * dp, steps);
  tp_comm tensor_group(mesh.group("tp"));
  const block_network net;
  const int v = schedule.chunks(), stage_rank = mesh.coordinate("pp");
  const auto bounds = pipeline::uniform_partition(static_cast<std::size_t>(net.blocks()), pp * v);
  std::vector<tp_mlp_stage<tp_comm>> chunks;
  for (int c = 0; c < v; ++c) {
    const int s = c * pp + stage_rank;
    chunks.emplace_back(tensor_group, net, bounds[s], bounds[s + 1], batch, mesh.coordinate("dp"), dp);
  }
  pipeline::trainer_options o;
  o.micro_batches = m;
  pipeline::trainer<group, Schedule, adam<double>, tp_mlp_stage<tp_comm>, tp_comm> trainer(
      mesh.group("pp"), std::move(chunks), adam<double>(0.01), schedule, o, tp_comm(mesh.group("dp")));
  for (int i = 0; i < steps; ++i) trainer.step();
  hybrid_result result;
  for (int c = 0; c < v; ++c) {
    const int s = c * pp + stage_rank;
    auto& stage = trainer.chunks()[c];
    for (std::size_t i = 0; i < stage.tensor_count(); ++i) {
      const int b = bounds[s] + static_cast<int>(i / 4);
      const auto expect = slice_of_tensor(want[4 * static_cast<std::size_t>(b) + i % 4], b, static_cast<int>(i % 4),
                                          mesh.coordinate("tp"), tpn);
      append_bytes(stage, i, result.bits);
      if (i % 4 == 3) append_bytes(stage, i, result.whole);
      const auto got = stage.parameters(i);
      bool same = got.size() == expect.size();
      for (std::size_t k = 0; same && k < got.size(); ++k)
        same = std::abs(got[k] - expect[k]) <= 1e-12 * std::max(1.0, std::abs(expect[k]));
      if (!same && result.first.empty())
        result.first =
            std::string(Schedule::name) + ": block " + std::to_string(b) + " tensor " + std::to_string(i % 4);
    }
  }
  return result;
}

}  // namespace dtrain::testing
