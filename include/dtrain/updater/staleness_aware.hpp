#pragma once
/// @file
/// Staleness-aware scaling (Zhang et al. 2016, DynSGD's rule): an update computed `s` clocks
/// ago is applied with learning rate lr / max(1, s).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>

#include "dtrain/concepts/updater.hpp"

namespace dtrain {

/// Wraps updater `U`, dividing its learning rate by the update's staleness (at least 1).
template <class U>
class staleness_aware : public U {
 public:
  static constexpr std::string_view name = "staleness_aware";
  using U::U;
  explicit staleness_aware(U inner) : U(std::move(inner)) {}

  /// `U::step` with the learning rate divided by max(1, info.staleness).
  template <class Params, class Grads>
  void step(Params params, Grads grads, std::size_t offset, step_info info) {
    info.lr_scale /= static_cast<double>(std::max<std::uint64_t>(1, info.staleness));
    U::step(params, grads, offset, info);
  }
};

}  // namespace dtrain
