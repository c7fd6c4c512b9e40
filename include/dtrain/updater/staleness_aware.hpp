#pragma once
/// @file
/// Staleness-aware scaling: an update whose measured staleness is s (server versions applied
/// since the worker read its parameters) is applied with learning rate lr / max(1, s + Offset).
/// Offset 0 is Zhang et al. 2016's alpha_0 / sigma; offset 1 is DynSGD's x + d / (s + 1), where
/// an update computed on the newest parameters has s = 0.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>

#include "dtrain/concepts/updater.hpp"

namespace dtrain {

/// Wraps updater `U`, dividing its learning rate by max(1, staleness + Offset).
template <class U, std::uint64_t Offset = 0>
class staleness_aware : public U {
 public:
  static constexpr std::string_view name = "staleness_aware";
  using U::U;
  explicit staleness_aware(U inner) : U(std::move(inner)) {}

  /// `U::step` with the learning rate divided by max(1, info.staleness + Offset).
  template <class Params, class Grads>
  void step(Params params, Grads grads, std::size_t offset, step_info info) {
    info.lr_scale /= static_cast<double>(std::max<std::uint64_t>(1, info.staleness + Offset));
    U::step(params, grads, offset, info);
  }
};

}  // namespace dtrain
