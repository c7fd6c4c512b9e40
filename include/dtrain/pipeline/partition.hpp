#pragma once
/// @file
/// Splitting a sequence of layers into contiguous pipeline stages: evenly by count, or so that
/// the costliest stage (parameters, or measured per-layer time) is as cheap as possible.
///
/// A partition is the list of stage boundaries: stage s holds layers [bounds[s], bounds[s + 1]),
/// bounds[0] = 0 and bounds[stages] = layers; every stage holds at least one layer.

#include <algorithm>
#include <cstddef>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "dtrain/core/error.hpp"

namespace dtrain::pipeline {

/// Stage boundaries: stage s holds layers [bounds[s], bounds[s + 1]).
using partition = std::vector<int>;

namespace detail {

inline void check_partition_arguments(std::size_t layers, int stages) {
  if (stages < 1 || layers < static_cast<std::size_t>(stages)) {
    throw error(errc::invalid_argument, "pipeline partition: " + std::to_string(layers) + " layers cannot fill " +
                                            std::to_string(stages) + " stages of at least one layer each");
  }
}

}  // namespace detail

/// Splits `layers` layers into `stages` stages of ⌊layers / stages⌋ or one more, the larger first.
/// @throws dtrain::error `invalid_argument` when there are fewer layers than stages.
inline partition uniform_partition(std::size_t layers, int stages) {
  detail::check_partition_arguments(layers, stages);
  partition bounds{0};
  const auto n = static_cast<int>(layers);
  for (int s = 0; s < stages; ++s) bounds.push_back(bounds.back() + n / stages + (s < n % stages ? 1 : 0));
  return bounds;
}

/// The cost of the costliest stage of `bounds` over per-layer `costs`.
inline double slowest_stage(std::span<const double> costs, const partition& bounds) {
  double worst = 0;
  for (std::size_t s = 0; s + 1 < bounds.size(); ++s) {
    double sum = 0;
    for (int l = bounds[s]; l < bounds[s + 1]; ++l) sum += costs[static_cast<std::size_t>(l)];
    worst = std::max(worst, sum);
  }
  return worst;
}

/// Splits layers of the given `costs` (parameter counts, measured seconds, ...) into `stages`
/// contiguous stages minimising the costliest stage (the pipeline's throughput bound). Exact:
/// dynamic programming over prefix sums, O(layers^2 * stages); among optimal partitions, the one
/// whose earlier stages are as large as possible.
/// @throws dtrain::error `invalid_argument` for fewer layers than stages or a negative cost.
inline partition balanced_partition(std::span<const double> costs, int stages) {
  detail::check_partition_arguments(costs.size(), stages);
  const std::size_t n = costs.size();
  std::vector<double> prefix(n + 1, 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    if (!(costs[i] >= 0))
      throw error(errc::invalid_argument, "pipeline partition: layer " + std::to_string(i) + " has a negative cost");
    prefix[i + 1] = prefix[i] + costs[i];
  }
  constexpr double inf = std::numeric_limits<double>::infinity();
  const auto k = static_cast<std::size_t>(stages);
  // best[s][i]: the least possible costliest stage putting the first i layers into s stages;
  // cut[s][i]: where the last of those s stages starts.
  std::vector<std::vector<double>> best(k + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<std::size_t>> cut(k + 1, std::vector<std::size_t>(n + 1, 0));
  best[0][0] = 0;
  for (std::size_t s = 1; s <= k; ++s) {
    for (std::size_t i = s; i <= n; ++i) {
      for (std::size_t j = i - 1; j + 1 >= s; --j) {  // the last stage holds layers [j, i)
        const double worst = std::max(best[s - 1][j], prefix[i] - prefix[j]);
        if (worst < best[s][i]) {
          best[s][i] = worst;
          cut[s][i] = j;
        }
        if (j == 0) break;
      }
    }
  }
  partition bounds(k + 1);
  bounds[k] = static_cast<int>(n);
  for (std::size_t s = k, i = n; s > 0; --s) {
    i = cut[s][i];
    bounds[s - 1] = static_cast<int>(i);
  }
  return bounds;
}

}  // namespace dtrain::pipeline
