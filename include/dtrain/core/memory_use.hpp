#pragma once
/// @file
/// `memory_use`: the bytes a trainer holds on its rank beyond the model's own tensors, by what
/// they are for (`allreduce::basic_trainer::memory()`, `sharded::trainer::memory()`), so that a
/// user can see what sharding or mixed precision saves and set a memory budget.

#include <algorithm>
#include <cstddef>

namespace dtrain {

struct memory_use {
  std::size_t parameters = 0;       ///< parameters the updater steps, where they are not the model's (a master copy)
  std::size_t gradients = 0;        ///< gradients the trainer keeps (averaged master gradients, accumulated batches)
  std::size_t optimizer_state = 0;  ///< the updater's state
  std::size_t buffers = 0;          ///< buckets collectives run on, 16-bit and top-k packing, residuals
  std::size_t gathered = 0;         ///< sharded stage 3: the gathered units' parameters (padded)
  std::size_t unit_gradients = 0;   ///< sharded stage 3: units' gradients, from backward to their reduce-scatter
  std::size_t device = 0;           ///< of the total, the bytes in device memory (the rest is host memory)
  std::size_t total() const noexcept {
    return parameters + gradients + optimizer_state + buffers + gathered + unit_gradients;
  }
  /// Raises each field to `now`'s where that is larger: a peak kept per kind.
  void raise_to(const memory_use& now) noexcept {
    for (auto field : {&memory_use::parameters, &memory_use::gradients, &memory_use::optimizer_state,
                       &memory_use::buffers, &memory_use::gathered, &memory_use::unit_gradients, &memory_use::device}) {
      this->*field = std::max(this->*field, now.*field);
    }
  }
};

}  // namespace dtrain
