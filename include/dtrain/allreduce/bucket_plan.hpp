#pragma once
/// @file
/// How a trainer groups gradient tensors into buckets, the unit of one allreduce.
///
/// Like PyTorch DDP: tensors are taken in reverse order (a backward pass finishes the last layer
/// first), a bucket closes once it holds at least its capacity, and the first bucket is small
/// so communication starts early in the backward pass.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dtrain/core/hash.hpp"

namespace dtrain::allreduce {

/// One bucket: consecutive tensors (in reverse index order) and where each sits in its buffer.
struct bucket {
  std::vector<std::size_t> tensors;  ///< tensor indices, in the order they are placed
  std::vector<std::size_t> offsets;  ///< element offset of each tensor in the bucket's buffer
  std::size_t elements = 0;          ///< total elements
};

/// The buckets of one model, and each tensor's bucket and offset in the parameter space.
class bucket_plan {
 public:
  bucket_plan() = default;

  /// Plans buckets for tensors of `sizes[i]` elements of `element_bytes` bytes each.
  /// @param first_bucket_bytes capacity of the first bucket (DDP: 1 MiB)
  /// @param bucket_bytes capacity of the others (DDP: 25 MiB)
  bucket_plan(std::span<const std::size_t> sizes, std::size_t element_bytes, std::size_t first_bucket_bytes,
              std::size_t bucket_bytes)
      : sizes_(sizes.begin(), sizes.end()), bucket_of_(sizes.size()), offset_(sizes.size()) {
    std::size_t running = 0;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      offset_[i] = running;
      running += sizes[i];
    }
    elements_ = running;
    bool open = false;
    for (std::size_t k = sizes.size(); k-- > 0;) {
      if (!open) buckets_.emplace_back();
      bucket& b = buckets_.back();
      bucket_of_[k] = buckets_.size() - 1;
      b.tensors.push_back(k);
      b.offsets.push_back(b.elements);
      b.elements += sizes[k];
      const std::size_t cap = buckets_.size() == 1 ? first_bucket_bytes : bucket_bytes;
      open = b.elements * element_bytes < cap;
    }
  }

  const std::vector<bucket>& buckets() const noexcept { return buckets_; }
  std::size_t tensor_count() const noexcept { return sizes_.size(); }
  std::size_t tensor_size(std::size_t i) const noexcept { return sizes_[i]; }
  /// Total parameters; tensor i owns [parameter_offset(i), + tensor_size(i)) in the updater.
  std::size_t elements() const noexcept { return elements_; }
  std::size_t bucket_of(std::size_t tensor) const noexcept { return bucket_of_[tensor]; }
  std::size_t parameter_offset(std::size_t tensor) const noexcept { return offset_[tensor]; }

  /// A 64-bit digest of the tensor sizes and bucket boundaries: equal plans, equal digests.
  std::uint64_t fingerprint() const noexcept {
    fnv1a h;
    h.word(sizes_.size());
    for (std::size_t s : sizes_) h.word(s);
    for (const bucket& b : buckets_) h.word(b.tensors.size());
    return h.value();
  }

  /// "3 buckets of 6 tensors, 235146 elements" for error messages and logs.
  std::string summary() const {
    return std::to_string(buckets_.size()) + " buckets of " + std::to_string(sizes_.size()) + " tensors, " +
           std::to_string(elements_) + " elements";
  }

 private:
  std::vector<std::size_t> sizes_, bucket_of_, offset_;
  std::vector<bucket> buckets_;
  std::size_t elements_ = 0;
};

}  // namespace dtrain::allreduce
