#pragma once
// The serial references the sharded trainers are checked against, besides the allreduce
// trainer's simulation (../allreduce/simulation.hpp).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "../allreduce/simulation.hpp"
#include "dtrain/concepts/updater.hpp"

namespace dtrain::testing {

// One updater over the whole model, stepped with the mean of the P replicas' gradients.
template <class Updater>
std::vector<double> serial_training(int p, int steps, Updater a) {
  std::vector<regression_data> data;
  for (int r = 0; r < p; ++r) data.push_back(data_of(r));
  std::vector<double> w(dim(), 0.25), g(dim()), mean(dim());
  a.resize(dim());
  for (int k = 0; k < steps; ++k) {
    const std::size_t begin = (static_cast<std::size_t>(k) * batch) % 400;
    std::fill(mean.begin(), mean.end(), 0.0);
    for (int r = 0; r < p; ++r) {
      least_squares_gradient(data[static_cast<std::size_t>(r)], w, begin, begin + batch, g);
      for (std::size_t j = 0; j < dim(); ++j) mean[j] += g[j] / static_cast<double>(p);
    }
    step_info info;
    info.step = static_cast<std::uint64_t>(k) + 1;
    a.step(std::span<double>(w), std::span<const double>(mean), 0, info);
  }
  return w;
}

}  // namespace dtrain::testing
