// Hybrid sharding (FSDP's HYBRID_SHARD): sharded within a group, replicated across groups, on
// process groups of one world. The job must train as P ranks averaging every gradient: the
// serial simulation of P replicas, every rank with the same bits; each rank holds its group's
// slice; a hybrid job's set resumes on plain sharded ranks.

#include <cstddef>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

#include "../allreduce/checks.hpp"  // require_close
#include "../allreduce/linear_model.hpp"
#include "../allreduce/simulation.hpp"
#include "../catch.hpp"
#include "dtrain/collective/communicator.hpp"
#include "dtrain/sharded/trainer.hpp"
#include "dtrain/sharded/unit_trainer.hpp"
#include "dtrain/transport/group.hpp"
#include "dtrain/transport/inproc.hpp"
#include "dtrain/updater/momentum.hpp"
#include "unit_model.hpp"

using namespace dtrain;
using namespace dtrain::testing;
using group = process_group<inproc_transport>;
using group_comm = ring<group>;

namespace {

struct hybrid_run {
  std::vector<std::vector<double>> weights;
  std::vector<std::size_t> slice_bytes;  // each rank's master slice
};

// `groups` groups of `width` ranks: rank r shards with r / width's group and is replicated
// across the ranks of its column r % width. Steps from step `from`; saves to `save` if given.
template <class Stage>
hybrid_run train(int groups, int width, int from, int steps, const std::string& save = "") {
  const int p = groups * width;
  hybrid_run out{std::vector<std::vector<double>>(static_cast<std::size_t>(p)),
                 std::vector<std::size_t>(static_cast<std::size_t>(p))};
  run_inproc(p, [&](int r, inproc_transport t) {
    const auto R = static_cast<std::size_t>(r);
    group world(std::move(t));
    group shard_group = *world.split(r / width, r);
    group replica_group = *world.split(r % width, r);
    auto data = data_of(r);
    const double start = r == 0 ? 0.25 : 1.0 + r;  // rank 0's start must reach every rank
    auto go = [&](auto& tr, auto&& weights_of) {
      for (int k = from; k < from + steps; ++k) {
        const std::size_t begin = (static_cast<std::size_t>(k) * batch) % 400;
        tr.step({begin, begin + batch});
      }
      if (!save.empty()) tr.save(save);
      out.weights[R] = weights_of();
      out.slice_bytes[R] = tr.memory().parameters;
    };
    if constexpr (std::is_same_v<Stage, sharded::zero3>) {
      unit_linear_model m(unit_sizes, data, start);
      sharded::trainer<group_comm, Stage, momentum<double>, unit_linear_model, group_comm> tr(
          group_comm(shard_group), group_comm(replica_group), momentum<double>(lr, mu), m);
      go(tr, [&] {
        std::vector<double> w;
        for (std::size_t u = 0; u < unit_sizes.size(); ++u) {
          const auto whole = tr.unit_parameters(u);
          w.insert(w.end(), whole.begin(), whole.end());
        }
        return w;
      });
    } else {
      linear_model m(tensor_sizes, data, start);
      sharded::trainer<group_comm, Stage, momentum<double>, linear_model, group_comm> tr(
          group_comm(shard_group), group_comm(replica_group), momentum<double>(lr, mu), m, sharded_buckets());
      go(tr, [&] { return m.weights(); });
    }
  });
  return out;
}

}  // namespace

TEMPLATE_TEST_CASE("hybrid sharding trains as every rank averaging, with each group's slices", "[sharded]",
                   sharded::zero1, sharded::zero2, sharded::zero3) {
  // 2 x 2, 2 groups of 3 (slices padded), 3 groups of 2.
  for (auto [groups, width] : {std::pair{2, 2}, std::pair{2, 3}, std::pair{3, 2}}) {
    INFO(groups << " groups of " << width);
    const auto got = train<TestType>(groups, width, 0, 30);
    require_close(got.weights[0], simulate(groups * width, 30, 1, 0)[0], 1e-12);
    for (const auto& w : got.weights) REQUIRE(w == got.weights[0]);
    // A group of `width` shares the parameters: 130 in buckets of 69 and 61, or units of 43,
    // 18, 60 and 9, cut `width` ways.
    const std::size_t slice = std::is_same_v<TestType, sharded::zero3>
                                  ? (width == 2 ? 22 + 9 + 30 + 5 : 15 + 6 + 20 + 3)
                                  : (width == 2 ? 35 + 31 : 23 + 21);
    for (std::size_t bytes : got.slice_bytes) CHECK(bytes == slice * sizeof(double));
  }
}

TEMPLATE_TEST_CASE("a hybrid job's set resumes on plain sharded ranks", "[sharded]", sharded::zero2,
                   sharded::zero3) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("dtrain-hybrid-" + std::to_string(::getpid()))).string();
  std::filesystem::create_directories(dir);
  train<TestType>(2, 2, 0, 10, dir + "/a");  // the first group writes the set, of 2 shards
  CHECK(std::filesystem::exists(sharded::shard_path(dir + "/a", 1, 2)));
  CHECK(!std::filesystem::exists(sharded::shard_path(dir + "/a", 0, 4)));
  std::vector<std::vector<double>> weights(4);
  run_inproc(4, [&](int r, inproc_transport t) {
    using inproc_ring = ring<inproc_transport>;
    auto data = data_of(r);
    auto go = [&](auto& tr) {
      tr.load(dir + "/a");
      for (int k = 10; k < 20; ++k) {
        const std::size_t begin = (static_cast<std::size_t>(k) * batch) % 400;
        tr.step({begin, begin + batch});
      }
    };
    if constexpr (std::is_same_v<TestType, sharded::zero3>) {
      unit_linear_model m(unit_sizes, data, 0.25);
      sharded::trainer<inproc_ring, TestType, momentum<double>, unit_linear_model> tr(
          inproc_ring(std::move(t)), momentum<double>(lr, mu), m);
      go(tr);
      for (std::size_t u = 0; u < unit_sizes.size(); ++u) {
        const auto whole = tr.unit_parameters(u);
        weights[static_cast<std::size_t>(r)].insert(weights[static_cast<std::size_t>(r)].end(), whole.begin(),
                                                    whole.end());
      }
    } else {
      linear_model m(tensor_sizes, data, 0.25);
      sharded::trainer<inproc_ring, TestType, momentum<double>, linear_model> tr(
          inproc_ring(std::move(t)), momentum<double>(lr, mu), m, sharded_buckets());
      go(tr);
      weights[static_cast<std::size_t>(r)] = m.weights();
    }
  });
  std::filesystem::remove_all(dir);
  require_close(weights[0], simulate(4, 20, 1, 0)[0], 1e-12);
}

TEST_CASE("hybrid stage 1 leaves every rank's model the gradient averaged over all ranks", "[sharded]") {
  constexpr int p = 4;
  std::vector<double> mean(dim(), 0.0), g(dim()), w0(dim(), 0.25);
  for (int r = 0; r < p; ++r) {
    least_squares_gradient(data_of(r), w0, 0, batch, g);
    for (std::size_t j = 0; j < dim(); ++j) mean[j] += g[j] / p;
  }
  std::vector<std::vector<double>> got(p);
  run_inproc(p, [&](int r, inproc_transport t) {
    group world(std::move(t));
    group pair = *world.split(r / 2, r), replicas = *world.split(r % 2, r);
    auto data = data_of(r);
    linear_model m(tensor_sizes, data, r == 0 ? 0.25 : 1.0 + r);
    sharded::trainer<group_comm, sharded::zero1, momentum<double>, linear_model, group_comm> tr(
        group_comm(pair), group_comm(replicas), momentum<double>(lr, mu), m, sharded_buckets());
    tr.step({0, batch});
    for (std::size_t i = 0; i < m.tensor_count(); ++i) {
      got[static_cast<std::size_t>(r)].insert(got[static_cast<std::size_t>(r)].end(), m.gradients(i).begin(),
                                              m.gradients(i).end());
    }
  });
  for (const auto& gr : got) require_close(gr, mean, 1e-13);
}
