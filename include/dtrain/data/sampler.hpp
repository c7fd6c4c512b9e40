#pragma once
/// @file
/// `distributed_sampler`: which samples each rank trains on in each epoch. Like PyTorch's
/// DistributedSampler, every rank draws the same permutation (seeded by seed and epoch) and
/// takes its own slice, so the ranks' shards are disjoint and change every epoch. Unlike it,
/// the shards are cut to equal length (the last n mod p samples of the epoch's permutation
/// are left out, a different few each epoch), because a synchronous trainer needs every rank
/// to take the same number of steps; padding with repeats would weight some samples twice.

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <utility>
#include <span>
#include <string>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/hash.hpp"

namespace dtrain::data {

/// Where a rank is in its data: the epoch, and the index into that epoch's `indices` of the
/// next sample to train on. Checkpoints carry it so a resumed job continues mid-epoch.
struct sampler_position {
  std::uint64_t epoch = 0;
  std::uint64_t next = 0;
};

/// Splits `samples` indices across `ranks` ranks, reshuffled every epoch, identically on all.
class distributed_sampler {
 public:
  /// @throws dtrain::error `invalid_argument` if there are fewer samples than ranks or `rank`
  ///   is out of range.
  distributed_sampler(std::size_t samples, int rank, int ranks, std::uint64_t seed = 0, bool shuffle = true)
      : samples_(samples), rank_(rank), ranks_(ranks), seed_(seed), shuffle_(shuffle) {
    if (ranks < 1 || rank < 0 || rank >= ranks) {
      throw error(errc::invalid_argument, "distributed_sampler: rank " + std::to_string(rank) + " of " +
                                              std::to_string(ranks));
    }
    if (samples < static_cast<std::size_t>(ranks)) {
      throw error(errc::invalid_argument, "distributed_sampler: " + std::to_string(samples) +
                                              " samples cannot be split across " + std::to_string(ranks) + " ranks");
    }
  }

  /// Samples per rank per epoch (equal on every rank).
  std::size_t shard_size() const noexcept { return samples_ / static_cast<std::size_t>(ranks_); }

  /// This rank's sample indices for `epoch`, in the order to visit them.
  std::vector<std::size_t> indices(std::uint64_t epoch) const {
    std::vector<std::size_t> perm(samples_);
    std::iota(perm.begin(), perm.end(), std::size_t{0});
    if (shuffle_) {
      // Fisher-Yates with splitmix64: the same sequence everywhere, whatever the standard library.
      std::uint64_t state = seed_ * 0x9e3779b97f4a7c15ull + epoch + 1;
      for (std::size_t i = samples_; i > 1; --i) {
        const std::size_t j = static_cast<std::size_t>(next(state) % i);
        std::swap(perm[i - 1], perm[j]);
      }
    }
    const std::size_t n = shard_size();
    const auto first = perm.begin() + static_cast<std::ptrdiff_t>(n * static_cast<std::size_t>(rank_));
    return std::vector<std::size_t>(first, first + static_cast<std::ptrdiff_t>(n));
  }

 private:
  static std::uint64_t next(std::uint64_t& s) noexcept {
    const std::uint64_t z = splitmix64(s);
    s += 0x9e3779b97f4a7c15ull;  // the generator's state advances by the increment splitmix64 adds
    return z;
  }

  std::size_t samples_;
  int rank_, ranks_;
  std::uint64_t seed_;
  bool shuffle_;
};

}  // namespace dtrain::data
