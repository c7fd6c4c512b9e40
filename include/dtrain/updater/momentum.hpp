#pragma once
/// @file
/// SGD with momentum, heavy-ball or Nesterov, in PyTorch's formulation (no dampening):
///   v <- mu * v + g;  w <- w - lr * v            (heavy ball)
///   v <- mu * v + g;  w <- w - lr * (g + mu * v)  (Nesterov)

#include <string_view>

#include "dtrain/updater/basic_updater.hpp"

namespace dtrain {

/// Momentum SGD. State: the velocity v (1 slot). A model of `updater`.
template <std::floating_point T = float>
class momentum : public basic_updater<momentum<T>, T, 1> {
 public:
  static constexpr std::string_view name = "momentum";
  /// @param lr learning rate  @param mu momentum factor  @param nesterov Nesterov's variant
  explicit momentum(double lr = 0.01, double mu = 0.9, bool nesterov = false)
      : basic_updater<momentum<T>, T, 1>(lr), mu_(static_cast<T>(mu)), nesterov_(nesterov) {}

  void update(T& w, T g, T* s, T lr) const noexcept {
    T& v = s[0];
    v = mu_ * v + g;
    w -= lr * (nesterov_ ? g + mu_ * v : v);
  }

 private:
  T mu_;
  bool nesterov_;
};

}  // namespace dtrain
