// The allreduce trainer's DDP essentials against the serial simulation (simulation.hpp):
// gradient accumulation equals one step on the concatenated batches, tensors a rank does not
// use get zero gradients on every rank, and global-norm clipping scales as the serial norm says.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "../catch.hpp"
#include "dtrain/allreduce/trainer.hpp"
#include "dtrain/collective/communicator.hpp"
#include "dtrain/transport/inproc.hpp"
#include "dtrain/updater/momentum.hpp"
#include "linear_model.hpp"
#include "simulation.hpp"

using namespace dtrain;
using namespace dtrain::testing;
using comm_t = ring<inproc_transport>;

namespace {

allreduce::trainer_options small_buckets() {
  allreduce::trainer_options o;
  o.first_bucket_bytes = 8 * 10;
  o.bucket_bytes = 8 * 64;
  return o;
}

void require_close(const std::vector<double>& got, const std::vector<double>& want, double rel) {
  REQUIRE(got.size() == want.size());
  for (std::size_t j = 0; j < got.size(); ++j) {
    INFO("weight " << j);
    REQUIRE(got[j] == Approx(want[j]).epsilon(rel).margin(rel));
  }
}

}  // namespace

TEST_CASE("k - 1 accumulates and a step equal one step on the k batches together", "[allreduce]") {
  for (int p : {1, 2, 3}) {
    for (std::size_t k : {std::size_t{2}, std::size_t{5}}) {
      INFO("ranks " << p << ", k " << k);
      std::vector<std::vector<double>> got(static_cast<std::size_t>(p));
      std::vector<std::size_t> batches;
      run_inproc(p, [&](int r, inproc_transport t) {
        auto data = data_of(r);
        linear_model m(tensor_sizes, data, 0.25);
        allreduce::trainer tr(comm_t(std::move(t)), momentum<double>(lr, mu), m, small_buckets());
        for (int s = 0; s < 12; ++s) {
          const std::size_t begin = (static_cast<std::size_t>(s) * k * batch) % 400;
          for (std::size_t j = 0; j + 1 < k; ++j) tr.accumulate({begin + j * batch, begin + (j + 1) * batch});
          const auto result = tr.step({begin + (k - 1) * batch, begin + k * batch});
          if (r == 0) batches.push_back(result.batches);
        }
        got[static_cast<std::size_t>(r)] = m.weights();
      });
      sim_options o;
      o.batch_size = k * batch;
      require_close(got[0], simulate(p, 12, o)[0], 1e-11);
      for (const auto& w : got) REQUIRE(w == got[0]);
      for (std::size_t b : batches) CHECK(b == k);
    }
  }
}

TEST_CASE("tensors a rank does not use get zero gradients, on every rank", "[allreduce]") {
  // Rank r skips tensor (step + r) % 6 in odd steps, and rank 0 also skips tensor 5 throughout,
  // so some tensors are unused on one rank, some on all ranks of a step, in buckets in flight.
  auto unused = [](int r, int step, std::size_t tensor) {
    return (step % 2 == 1 && tensor == static_cast<std::size_t>(step + r) % 6) || (r == 0 && tensor == 5);
  };
  for (int p : {1, 2, 3}) {
    INFO("ranks " << p);
    std::vector<std::vector<double>> got(static_cast<std::size_t>(p));
    run_inproc(p, [&](int r, inproc_transport t) {
      auto data = data_of(r);
      linear_model m(tensor_sizes, data, 0.25);
      int step = 0;
      m.unused = [&](std::size_t tensor) { return unused(r, step, tensor); };
      auto o = small_buckets();
      o.find_unused_parameters = true;
      allreduce::trainer tr(comm_t(std::move(t)), momentum<double>(lr, mu), m, o);
      for (; step < 20; ++step) {
        const std::size_t begin = (static_cast<std::size_t>(step) * batch) % 400;
        tr.step({begin, begin + batch});
      }
      got[static_cast<std::size_t>(r)] = m.weights();
    });
    sim_options o;
    o.unused = unused;
    require_close(got[0], simulate(p, 20, o)[0], 1e-12);
    for (const auto& w : got) REQUIRE(w == got[0]);
  }

  SECTION("without the option, an unused tensor is an error naming it") {
    run_inproc(2, [&](int r, inproc_transport t) {
      auto data = data_of(r);
      linear_model m(tensor_sizes, data, 0.25);
      m.unused = [](std::size_t tensor) { return tensor == 2; };
      allreduce::trainer tr(comm_t(std::move(t)), momentum<double>(lr, mu), m, small_buckets());
      REQUIRE_THROWS_WITH(tr.step({0, batch}), Catch::Contains("never reported tensor 2"));
    });
  }
}

TEST_CASE("clipping scales the averaged gradient to the serial global norm", "[allreduce]") {
  const double max_norm = 25;  // the gradient's norm runs from about 36 down to 20 here
  std::vector<double> norms;
  std::vector<std::vector<double>> got(3);
  run_inproc(3, [&](int r, inproc_transport t) {
    auto data = data_of(r);
    linear_model m(tensor_sizes, data, 0.25);
    auto o = small_buckets();
    o.clip_grad_norm = max_norm;
    allreduce::trainer tr(comm_t(std::move(t)), momentum<double>(lr, mu), m, o);
    for (int s = 0; s < 25; ++s) {
      const std::size_t begin = (static_cast<std::size_t>(s) * batch) % 400;
      const double norm = tr.step({begin, begin + batch}).grad_norm;
      if (r == 0) norms.push_back(norm);
    }
    got[static_cast<std::size_t>(r)] = m.weights();
  });
  sim_options o;
  o.clip = max_norm;
  require_close(got[0], simulate(3, 25, o)[0], 1e-12);
  for (const auto& w : got) REQUIRE(w == got[0]);
  // The bound was active in some steps and not in others, so both paths ran.
  CHECK(std::count_if(norms.begin(), norms.end(), [&](double n) { return n > max_norm; }) > 0);
  CHECK(std::count_if(norms.begin(), norms.end(), [&](double n) { return n < max_norm; }) > 0);
  // And clipping changed the result.
  REQUIRE(std::abs(got[0][0] - simulate(3, 25, sim_options{})[0][0]) > 1e-9);
}
