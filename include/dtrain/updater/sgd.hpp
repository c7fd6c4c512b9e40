#pragma once
/// @file
/// Plain stochastic gradient descent, with L2 weight decay wd as PyTorch's `SGD(weight_decay=)`:
///   w <- w - lr * (g + wd * w).

#include <string_view>

#include "dtrain/updater/basic_updater.hpp"

namespace dtrain {

/// SGD's per-element rule.
template <std::floating_point T>
struct sgd_rule {
  T weight_decay = T(0);
  DTRAIN_HOST_DEVICE void operator()(T& w, T g, T*, T lr) const noexcept { w -= lr * (g + weight_decay * w); }
};

/// w <- w - lr * (g + wd * w). No state. A model of `updater`.
template <std::floating_point T = float>
class sgd : public basic_updater<sgd_rule<T>, T, 0> {
 public:
  static constexpr std::string_view name = "sgd";
  /// @param lr learning rate  @param weight_decay L2 penalty added to the gradient
  explicit sgd(double lr = 0.01, double weight_decay = 0.0)
      : basic_updater<sgd_rule<T>, T, 0>(lr, {static_cast<T>(weight_decay)}) {}
};

}  // namespace dtrain
