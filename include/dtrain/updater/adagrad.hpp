#pragma once
/// @file
/// Adagrad (Duchi, Hazan and Singer 2011): G <- G + g^2;  w <- w - lr * g / (sqrt(G) + eps).

#include <cmath>
#include <string_view>

#include "dtrain/updater/basic_updater.hpp"

namespace dtrain {

/// Adagrad's per-element rule.
template <std::floating_point T>
struct adagrad_rule {
  T eps;
  DTRAIN_HOST_DEVICE void operator()(T& w, T g, T* s, T lr) const noexcept {
    T& sum = s[0];
    sum += g * g;
    w -= lr * g / (std::sqrt(sum) + eps);
  }
};

/// Adagrad. State: the sum of squared gradients G (1 slot). A model of `updater`.
template <std::floating_point T = float>
class adagrad : public basic_updater<adagrad_rule<T>, T, 1> {
 public:
  static constexpr std::string_view name = "adagrad";
  explicit adagrad(double lr = 0.01, double eps = 1e-10)
      : basic_updater<adagrad_rule<T>, T, 1>(lr, {static_cast<T>(eps)}) {}
};

}  // namespace dtrain
