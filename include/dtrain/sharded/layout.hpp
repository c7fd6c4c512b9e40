#pragma once
/// @file
/// `sharded::shard_layout`: which part of a model's state each rank of a sharded trainer owns.
///
/// The unit of sharding is the bucket (allreduce/bucket_plan.hpp), as FSDP's unit is its flat
/// parameter: bucket b's tensors, packed side by side in plan order, are padded with zeros to a
/// multiple of the world size P and cut into P equal slices; rank r owns slice r of every
/// bucket. A rank's shard is its slices of all buckets, one after another, in bucket order, so
/// its optimizer state, gradient and master parameters are each about 1/P of the model's
/// (ZeRO, Rajbhandari et al., SC'20). One bucket's reduce-scatter gives each rank exactly its
/// slice, and one allgather gives everyone the bucket back.

#include <algorithm>
#include <cstddef>
#include <span>
#include <type_traits>
#include <vector>

#include "dtrain/allreduce/bucket_plan.hpp"
#include "dtrain/core/element.hpp"

namespace dtrain::sharded {

using allreduce::bucket;
using allreduce::bucket_plan;

class shard_layout {
 public:
  shard_layout() = default;

  /// The layout of `plan`'s buckets over `world` ranks.
  shard_layout(const bucket_plan& plan, int world) : shard_layout(lengths_of(plan), world) {}

  /// The layout of parts (buckets, or stage 3's units) of `lengths[b]` elements over `world` ranks.
  shard_layout(const std::vector<std::size_t>& lengths, int world) : world_(static_cast<std::size_t>(world)) {
    for (const std::size_t length : lengths) {
      const std::size_t slice = (length + world_ - 1) / world_;
      slice_offset_.push_back(shard_elements_);
      slice_.push_back(slice);
      shard_elements_ += slice;
      largest_padded_ = std::max(largest_padded_, slice * world_);
    }
  }

  /// Elements of one rank's shard: its slices of every bucket.
  std::size_t shard_elements() const noexcept { return shard_elements_; }
  /// Elements of each rank's slice of part `b`.
  std::size_t slice(std::size_t b) const noexcept { return slice_[b]; }
  /// Where part `b`'s slice starts in a rank's shard.
  std::size_t slice_offset(std::size_t b) const noexcept { return slice_offset_[b]; }
  /// Part `b` padded to a multiple of the world size: P slices.
  std::size_t padded(std::size_t b) const noexcept { return slice_[b] * world_; }
  /// The largest padded part: a buffer any part fits in.
  std::size_t largest_padded() const noexcept { return largest_padded_; }

 private:
  static std::vector<std::size_t> lengths_of(const bucket_plan& plan) {
    std::vector<std::size_t> lengths;
    for (const bucket& b : plan.buckets()) lengths.push_back(b.elements);
    return lengths;
  }

  std::size_t world_ = 1;
  std::vector<std::size_t> slice_, slice_offset_;
  std::size_t shard_elements_ = 0;
  std::size_t largest_padded_ = 0;
};

using allreduce::pack;
using allreduce::unpack;

}  // namespace dtrain::sharded
