#pragma once
/// @file
/// Plain stochastic gradient descent: w <- w - lr * g.

#include <string_view>

#include "dtrain/updater/basic_updater.hpp"

namespace dtrain {

/// SGD's per-element rule.
template <std::floating_point T>
struct sgd_rule {
  DTRAIN_HOST_DEVICE void operator()(T& w, T g, T*, T lr) const noexcept { w -= lr * g; }
};

/// w <- w - lr * g. No state. A model of `updater`.
template <std::floating_point T = float>
class sgd : public basic_updater<sgd_rule<T>, T, 0> {
 public:
  static constexpr std::string_view name = "sgd";
  explicit sgd(double lr = 0.01) : basic_updater<sgd_rule<T>, T, 0>(lr, {}) {}
};

}  // namespace dtrain
