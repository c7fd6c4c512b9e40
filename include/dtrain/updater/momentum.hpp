#pragma once
/// @file
/// SGD with momentum, heavy-ball or Nesterov, in PyTorch's formulation (no dampening):
///   v <- mu * v + g;  w <- w - lr * v            (heavy ball)
///   v <- mu * v + g;  w <- w - lr * (g + mu * v)  (Nesterov)

#include <string_view>

#include "dtrain/updater/basic_updater.hpp"

namespace dtrain {

/// Momentum's per-element rule.
template <std::floating_point T>
struct momentum_rule {
  T mu;
  bool nesterov;
  DTRAIN_HOST_DEVICE void operator()(T& w, T g, T* s, T lr) const noexcept {
    T& v = s[0];
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
  explicit momentum(double lr = 0.01, double mu = 0.9, bool nesterov = false)
      : basic_updater<momentum_rule<T>, T, 1>(lr, {static_cast<T>(mu), nesterov}) {}
};

}  // namespace dtrain
