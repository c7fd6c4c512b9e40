#pragma once
/// @file
/// RMSProp (Tieleman and Hinton 2012):
///   E <- rho * E + (1 - rho) * g^2;  w <- w - lr * g / (sqrt(E) + eps).

#include <cmath>
#include <string_view>

#include "dtrain/updater/basic_updater.hpp"

namespace dtrain {

/// RMSProp's per-element rule.
template <std::floating_point T>
struct rmsprop_rule {
  T rho;
  T eps;
  DTRAIN_HOST_DEVICE void operator()(T& w, T g, T* s, T lr) const noexcept {
    T& mean_sq = s[0];
    mean_sq = rho * mean_sq + (T(1) - rho) * g * g;
    w -= lr * g / (std::sqrt(mean_sq) + eps);
  }
};

/// RMSProp. State: the running mean of squared gradients E (1 slot). A model of `updater`.
template <std::floating_point T = float>
class rmsprop : public basic_updater<rmsprop_rule<T>, T, 1> {
 public:
  static constexpr std::string_view name = "rmsprop";
  explicit rmsprop(double lr = 0.01, double rho = 0.99, double eps = 1e-8)
      : basic_updater<rmsprop_rule<T>, T, 1>(lr, {static_cast<T>(rho), static_cast<T>(eps)}) {}
};

}  // namespace dtrain
