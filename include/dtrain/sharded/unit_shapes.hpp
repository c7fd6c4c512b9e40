#pragma once
/// @file
/// `sharded::unit_shapes`: a unit model's units as the stage-3 trainer (basic_unit_trainer.hpp)
/// lays them out: each unit's tensors side by side, their sizes and offsets, the unit's length
/// (one part of the shard layout), what a checkpoint records of them and what ranks compare.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/hash.hpp"
#include "dtrain/sharded/checkpoint.hpp"

namespace dtrain::sharded {

class unit_shapes {
 public:
  unit_shapes() = default;
  /// `model`'s units (`unit_count()`, `unit_tensors(u)`). @throws dtrain::error
  ///   `invalid_argument` naming `who` for a unit without tensors.
  template <class Model>
  unit_shapes(const Model& model, const std::string& who) : sizes_(model.unit_count()), offsets_(sizes_.size()) {
    for (std::size_t u = 0; u < sizes_.size(); ++u) {
      sizes_[u] = model.unit_tensors(u);
      if (sizes_[u].empty()) {
        throw error(errc::invalid_argument, who + ": unit " + std::to_string(u) + " has no tensors");
      }
      std::size_t length = 0;
      for (const std::size_t n : sizes_[u]) {
        offsets_[u].push_back(length);
        length += n;
      }
      lengths_.push_back(length);
    }
  }

  std::size_t count() const noexcept { return sizes_.size(); }
  std::size_t tensors(std::size_t u) const noexcept { return sizes_[u].size(); }
  std::size_t size(std::size_t u, std::size_t k) const noexcept { return sizes_[u][k]; }
  std::size_t offset(std::size_t u, std::size_t k) const noexcept { return offsets_[u][k]; }
  std::size_t length(std::size_t u) const noexcept { return lengths_[u]; }
  const std::vector<std::size_t>& lengths() const noexcept { return lengths_; }

  /// @throws dtrain::error `invalid_argument` ("<who>: <call>(u, k): the model has N units, unit
  ///   u has M tensors") where the model names a unit or tensor it does not have.
  void check(std::size_t u, std::size_t k, const char* call, const std::string& who) const {
    if (u < count() && k < tensors(u)) return;
    throw error(errc::invalid_argument, who + ": " + call + "(" + std::to_string(u) + ", " + std::to_string(k) +
                                            "): the model has " + std::to_string(count()) + " units" +
                                            (u < count() ? ", unit " + std::to_string(u) + " has " +
                                                               std::to_string(tensors(u)) + " tensors"
                                                         : std::string()));
  }

  /// A checkpoint's record of them: the units' lengths and every tensor's size, in order.
  void describe(shard_identity& id) const {
    for (std::size_t u = 0; u < count(); ++u) {
      id.parts.push_back(lengths_[u]);
      id.sizes.insert(id.sizes.end(), sizes_[u].begin(), sizes_[u].end());
    }
  }

  /// Every unit's elements together.
  std::size_t elements() const noexcept {
    std::size_t total = 0;
    for (const std::size_t n : lengths_) total += n;
    return total;
  }

  /// What ranks compare at start-up: a digest of every unit's tensor count and sizes.
  std::uint64_t digest() const {
    fnv1a h;
    for (std::size_t u = 0; u < count(); ++u) {
      h.word(tensors(u));
      for (const std::size_t n : sizes_[u]) h.word(n);
    }
    return h.value();
  }

 private:
  std::vector<std::vector<std::size_t>> sizes_, offsets_;  // of each unit's tensors, in the unit
  std::vector<std::size_t> lengths_;
};

}  // namespace dtrain::sharded
