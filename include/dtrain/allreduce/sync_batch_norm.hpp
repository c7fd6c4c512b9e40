#pragma once
/// @file
/// Synchronised batch normalisation: the batch statistics of every rank's batch combined, so a
/// batch-norm layer normalises with the global batch's moments, as on one process.
///
/// A model calls these inside `forward_backward`, passing the trainer's `sum_across_ranks`
/// (which runs in order with the gradient buckets, so every rank sums in the same order):
/// <!-- frame: header_sync_batch_norm -->
/// @code
/// auto sum = [&](std::span<double> v) { trainer.sum_across_ranks(v); };
/// auto m = dtrain::allreduce::sync_batch_moments<float>(activations, channels, sum);
/// // forward: y = (x - m.mean[c]) / sqrt(m.variance[c] + eps) * gamma[c] + beta[c]
/// // backward: sync_channel_sums over dy and dy * x_hat give the global sums the gradient needs
/// @endcode

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dtrain/core/error.hpp"

namespace dtrain::allreduce {

/// Per-channel moments of the global batch.
struct batch_moments {
  std::vector<double> mean;      ///< per channel
  std::vector<double> variance;  ///< per channel, biased (divided by count), as batch norm uses
  std::uint64_t count = 0;       ///< samples in the global batch
};

namespace detail {
inline void check_layout(std::size_t values, std::size_t channels, const char* who) {
  if (channels == 0 || values % channels != 0) {
    throw error(errc::invalid_argument, std::string(who) + ": " + std::to_string(values) +
                                            " values do not form rows of " + std::to_string(channels) +
                                            " channels");
  }
}
}  // namespace detail

/// Mean and variance per channel over the batches of all ranks.
/// @param x this rank's batch, row-major [samples][channels] (may have 0 samples)
/// @param sum_across_ranks callable `(std::span<double>)` summing in place across ranks
/// @throws dtrain::error `invalid_argument` if `x` is not whole rows, or the global batch is
///   empty; whatever `sum_across_ranks` throws.
template <std::floating_point T, class SumAcrossRanks>
batch_moments sync_batch_moments(std::span<const T> x, std::size_t channels, SumAcrossRanks&& sum_across_ranks) {
  detail::check_layout(x.size(), channels, "sync_batch_moments");
  const std::size_t rows = x.size() / channels;
  // One pass of sums and squares: it loses precision only when |mean| >> stddev, which
  // accumulating in double keeps harmless for activations; and it needs a single allreduce.
  std::vector<double> sums(2 * channels + 1, 0.0);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < channels; ++c) {
      const double v = static_cast<double>(x[r * channels + c]);
      sums[c] += v;
      sums[channels + c] += v * v;
    }
  }
  sums[2 * channels] = static_cast<double>(rows);
  sum_across_ranks(std::span<double>(sums));
  batch_moments m;
  m.count = static_cast<std::uint64_t>(sums[2 * channels]);
  if (m.count == 0) throw error(errc::invalid_argument, "sync_batch_moments: the global batch is empty");
  const double n = sums[2 * channels];
  m.mean.resize(channels);
  m.variance.resize(channels);
  for (std::size_t c = 0; c < channels; ++c) {
    m.mean[c] = sums[c] / n;
    m.variance[c] = std::max(0.0, sums[channels + c] / n - m.mean[c] * m.mean[c]);
  }
  return m;
}

/// Per-channel sums of `x` ([samples][channels]) over the batches of all ranks: the backward
/// pass of synchronised batch norm needs those of dy and of dy * x_hat.
template <std::floating_point T, class SumAcrossRanks>
std::vector<double> sync_channel_sums(std::span<const T> x, std::size_t channels, SumAcrossRanks&& sum_across_ranks) {
  detail::check_layout(x.size(), channels, "sync_channel_sums");
  std::vector<double> sums(channels, 0.0);
  for (std::size_t i = 0; i < x.size(); ++i) sums[i % channels] += static_cast<double>(x[i]);
  sum_across_ranks(std::span<double>(sums));
  return sums;
}

}  // namespace dtrain::allreduce
