// The example in README.md, verbatim between the markers, compiled and run: docs show code that
// builds. compute_gradients is a least-squares model with target weights 1, 2, 3, ...

#include <cmath>
#include <span>
#include <vector>

#include "../catch.hpp"
#include "dtrain/transport/inproc.hpp"

namespace {
void compute_gradients(std::span<double> weights, std::span<double> grads) {
  for (std::size_t i = 0; i < weights.size(); ++i) grads[i] = weights[i] - static_cast<double>(i + 1);
}
}  // namespace

// README begin
#include <dtrain/dtrain.hpp>

// One rank of a data-parallel job (ranks are threads here; the TCP transport makes them processes).
void train(dtrain::inproc_transport endpoint, std::span<double> weights, std::span<double> grads) {
  dtrain::communicator<dtrain::inproc_transport> comm(std::move(endpoint));  // algorithm chosen per call
  dtrain::momentum<double> opt(/*lr=*/0.01, /*mu=*/0.9);
  opt.resize(weights.size());
  comm.broadcast(weights, /*root=*/0);                // every replica starts equal
  for (int step = 0; step < 100; ++step) {
    compute_gradients(weights, grads);               // your model
    comm.allreduce(grads, dtrain::reduce_op::avg);   // average across ranks
    opt.step(weights, grads, 0, {});                 // same update on every replica
  }
}
// README end

TEST_CASE("README: the example trains identical replicas towards the target", "[docs]") {
  const int p = 3;
  std::vector<std::vector<double>> w(p, std::vector<double>(4));
  for (int r = 0; r < p; ++r) w[static_cast<std::size_t>(r)].assign(4, r * 10.0);  // only rank 0's counts
  dtrain::run_inproc(p, [&](int r, dtrain::inproc_transport t) {
    std::vector<double> g(4);
    train(std::move(t), std::span(w[static_cast<std::size_t>(r)]), std::span(g));
  });
  for (int r = 1; r < p; ++r) CHECK(w[static_cast<std::size_t>(r)] == w[0]);
  // 100 momentum steps from 0 on (w - target): the error shrinks well below its start.
  for (std::size_t i = 0; i < 4; ++i)
    CHECK(std::fabs(w[0][i] - static_cast<double>(i + 1)) < 0.5 * static_cast<double>(i + 1));
}
