#pragma once
/// @file
/// `delta`: applies pushed parameter deltas, w <- w + lr * d. The server side of the algorithms
/// whose workers send changes of parameters rather than gradients (EASGD's elastic term, ADAG,
/// model averaging, DynSGD); with `staleness_aware<delta<T>, 1>` it is DynSGD's
/// x <- x + d / (staleness + 1).

#include <string_view>

#include "dtrain/updater/basic_updater.hpp"

namespace dtrain {

/// The delta updater's per-element rule.
template <std::floating_point T>
struct delta_rule {
  DTRAIN_HOST_DEVICE void operator()(T& w, T d, T*, T lr) const noexcept { w += lr * d; }
};

/// Adds deltas (no state). `lr` scales them (1 by default). A model of `updater`.
template <std::floating_point T = float>
class delta : public basic_updater<delta_rule<T>, T, 0> {
 public:
  static constexpr std::string_view name = "delta";
  explicit delta(double lr = 1.0) : basic_updater<delta_rule<T>, T, 0>(lr, {}) {}
};

}  // namespace dtrain
