#pragma once
/// @file
/// SGD with momentum, heavy-ball or Nesterov, in PyTorch's formulation (no dampening), with L2
/// weight decay wd added to the gradient first, as PyTorch's `SGD(momentum=, weight_decay=)`:
///   g <- g + wd * w;  v <- mu * v + g;  w <- w - lr * v            (heavy ball)
///   g <- g + wd * w;  v <- mu * v + g;  w <- w - lr * (g + mu * v)  (Nesterov)

#include <string_view>

#include "dtrain/updater/basic_updater.hpp"

namespace dtrain {

/// Momentum's per-element rule.
template <std::floating_point T>
struct momentum_rule {
  T mu;
  bool nesterov;
  T weight_decay = T(0);
  DTRAIN_HOST_DEVICE void operator()(T& w, T g, T* s, T lr) const noexcept {
    T& v = s[0];
    g += weight_decay * w;
    v = mu * v + g;
    w -= lr * (nesterov ? g + mu * v : v);
  }
};

/// Momentum SGD. State: the velocity v (1 slot). A model of `updater`.
template <std::floating_point T = float>
class momentum : public basic_updater<momentum_rule<T>, T, 1> {
 public:
  static constexpr std::string_view name = "momentum";
  /// @param lr learning rate  @param mu momentum factor  @param nesterov Nesterov's variant
  /// @param weight_decay L2 penalty added to the gradient
  explicit momentum(double lr = 0.01, double mu = 0.9, bool nesterov = false, double weight_decay = 0.0)
      : basic_updater<momentum_rule<T>, T, 1>(lr, {static_cast<T>(mu), nesterov, static_cast<T>(weight_decay)}) {}
};

}  // namespace dtrain
