#pragma once
// The serial simulation the allreduce trainer is checked against, shared by the in-process
// tests and the multi-process TCP worker: P replicas of the least-squares model of
// linear_model.hpp, each with its own data, weights and momentum.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <vector>

#include "linear_model.hpp"

namespace dtrain::testing {

inline const std::vector<std::size_t> tensor_sizes{3, 40, 1, 17, 60, 9};  // 130 features
constexpr std::size_t batch = 8;
constexpr double lr = 0.05, mu = 0.9;

inline std::size_t dim() { return 130; }
inline regression_data data_of(int rank) { return regression_data(dim(), 400, 100u + static_cast<unsigned>(rank)); }

// What the simulation varies. Synchronous steps average the P gradients; local steps (from
// step `local_after`, when tau > 1) use each replica's own, and every tau-th local step averages
// the weights.
struct sim_options {
  std::size_t tau = 1;
  std::size_t local_after = 0;
  std::function<double(std::size_t)> rate;  // step k's learning rate instead of `lr`
  std::size_t batch_size = batch;            // samples per replica per step
  double clip = 0;                           // global-norm clipping of the averaged gradient
  // Whether `tensor` gets no gradient on `rank` in step `step` (zero in the average).
  std::function<bool(int rank, int step, std::size_t tensor)> unused;
  // Top-k with error feedback over the whole gradient (one bucket): each replica sends its
  // ceil(density * dim) largest entries of gradient + residual; 0 is dense.
  double topk_density = 0;
};

// Replica r's top-k contribution with error feedback: a = g + e, keep the k largest |a|,
// e = the rest.
inline std::vector<double> topk_with_feedback(std::vector<double>& residual, const std::vector<double>& g,
                                              double density) {
  std::vector<double> a(g.size());
  for (std::size_t j = 0; j < g.size(); ++j) a[j] = g[j] + residual[j];
  std::vector<std::size_t> by_size(g.size());
  for (std::size_t j = 0; j < g.size(); ++j) by_size[j] = j;
  const auto k = static_cast<std::size_t>(std::ceil(density * static_cast<double>(g.size())));
  std::partial_sort(by_size.begin(), by_size.begin() + static_cast<std::ptrdiff_t>(k), by_size.end(),
                    [&](std::size_t x, std::size_t y) { return std::fabs(a[x]) > std::fabs(a[y]); });
  std::vector<double> sent(g.size(), 0.0);
  residual = a;
  for (std::size_t j = 0; j < k; ++j) {
    sent[by_size[j]] = a[by_size[j]];
    residual[by_size[j]] = 0;
  }
  return sent;
}

inline std::size_t tensor_of(std::size_t feature) {
  std::size_t t = 0;
  for (std::size_t end = tensor_sizes[0]; feature >= end; end += tensor_sizes[++t]) {
  }
  return t;
}

// The serial simulation: P replicas, each with its own weights and velocity.
inline std::vector<std::vector<double>> simulate(int p, int steps, const sim_options& o) {
  std::vector<regression_data> data;
  for (int r = 0; r < p; ++r) data.push_back(data_of(r));
  const auto P = static_cast<std::size_t>(p);
  std::vector<std::vector<double>> w(P, std::vector<double>(dim(), 0.25)), v(P, std::vector<double>(dim(), 0.0));
  std::vector<std::vector<double>> g(P, std::vector<double>(dim())), residual(P, std::vector<double>(dim(), 0.0));
  for (int k = 0; k < steps; ++k) {
    const std::size_t begin = (static_cast<std::size_t>(k) * o.batch_size) % 400;
    for (std::size_t r = 0; r < P; ++r) {
      dtrain::testing::least_squares_gradient(data[r], w[r], begin, begin + o.batch_size, g[r]);
      for (std::size_t j = 0; j < dim() && o.unused; ++j) {
        if (o.unused(static_cast<int>(r), k, tensor_of(j))) g[r][j] = 0;
      }
    }
    const bool local = o.tau > 1 && static_cast<std::size_t>(k) >= o.local_after;
    if (!local && o.topk_density > 0) {
      for (std::size_t r = 0; r < P; ++r) g[r] = topk_with_feedback(residual[r], g[r], o.topk_density);
    }
    if (!local) {
      std::vector<double> mean(dim(), 0.0);
      for (std::size_t r = 0; r < P; ++r)
        for (std::size_t j = 0; j < dim(); ++j) mean[j] += g[r][j] / static_cast<double>(p);
      if (o.clip > 0) {
        double squares = 0;
        for (double x : mean) squares += x * x;
        const double factor = o.clip / (std::sqrt(squares) + 1e-6);
        for (double& x : mean) x *= factor < 1 ? factor : 1.0;
      }
      for (auto& gr : g) gr = mean;
    }
    const double step_lr = o.rate ? o.rate(static_cast<std::size_t>(k)) : lr;
    for (std::size_t r = 0; r < P; ++r) {
      for (std::size_t j = 0; j < dim(); ++j) {
        v[r][j] = mu * v[r][j] + g[r][j];
        w[r][j] -= step_lr * v[r][j];
      }
    }
    if (local && (static_cast<std::size_t>(k) + 1 - o.local_after) % o.tau == 0) {
      std::vector<double> mean(dim(), 0.0);
      for (std::size_t r = 0; r < P; ++r)
        for (std::size_t j = 0; j < dim(); ++j) mean[j] += w[r][j] / static_cast<double>(p);
      for (auto& wr : w) wr = mean;
    }
  }
  return w;
}

inline std::vector<std::vector<double>> simulate(int p, int steps, std::size_t tau, std::size_t local_after,
                                                 const std::function<double(std::size_t)>& rate = {}) {
  sim_options o;
  o.tau = tau;
  o.local_after = local_after;
  o.rate = rate;
  return simulate(p, steps, o);
}

}  // namespace dtrain::testing
