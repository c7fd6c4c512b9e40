#pragma once
/// @file
/// Adam (Kingma and Ba 2015) with bias correction:
///   t <- t + 1;  m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
///   w <- w - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
/// The step count t is kept per parameter, so sparse keys touched at different rates each get
/// their own bias correction ("lazy Adam"); for dense updates all counts are equal.
///
/// AdamW (Loshchilov and Hutter 2019) decays the weights apart from the gradient's moments, as
/// PyTorch's `AdamW`: w <- w - lr * wd * w, then Adam's step. (L2 decay added to an Adam
/// gradient is divided by sqrt(v) like the gradient, so large-gradient weights decay less.)

#include <cmath>
#include <string_view>

#include "dtrain/updater/basic_updater.hpp"

namespace dtrain {

/// Adam's per-element rule.
template <std::floating_point T>
struct adam_rule {
  T b1;
  T b2;
  T eps;
  DTRAIN_HOST_DEVICE void operator()(T& w, T g, T* s, T lr) const noexcept {
    T& m = s[0];
    T& v = s[1];
    T& t = s[2];
    t += T(1);
    m = b1 * m + (T(1) - b1) * g;
    v = b2 * v + (T(1) - b2) * g * g;
    T m_hat = m / (T(1) - std::pow(b1, t));
    T v_hat = v / (T(1) - std::pow(b2, t));
    w -= lr * m_hat / (std::sqrt(v_hat) + eps);
  }
};

/// Adam. State: m, v and the parameter's step count t (3 slots). A model of `updater`.
template <std::floating_point T = float>
class adam : public basic_updater<adam_rule<T>, T, 3> {
 public:
  static constexpr std::string_view name = "adam";
  explicit adam(double lr = 0.001, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8)
      : basic_updater<adam_rule<T>, T, 3>(lr, {static_cast<T>(beta1), static_cast<T>(beta2), static_cast<T>(eps)}) {}
};

/// AdamW's per-element rule: decoupled decay, then Adam's.
template <std::floating_point T>
struct adamw_rule {
  adam_rule<T> adam;
  T weight_decay;
  DTRAIN_HOST_DEVICE void operator()(T& w, T g, T* s, T lr) const noexcept {
    w -= lr * weight_decay * w;
    adam(w, g, s, lr);
  }
};

/// AdamW. State as Adam's (m, v, t). A model of `updater`.
template <std::floating_point T = float>
class adamw : public basic_updater<adamw_rule<T>, T, 3> {
 public:
  static constexpr std::string_view name = "adamw";
  /// PyTorch's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.01.
  explicit adamw(double lr = 0.001, double weight_decay = 0.01, double beta1 = 0.9, double beta2 = 0.999,
                 double eps = 1e-8)
      : basic_updater<adamw_rule<T>, T, 3>(
            lr, {{static_cast<T>(beta1), static_cast<T>(beta2), static_cast<T>(eps)}, static_cast<T>(weight_decay)}) {}
};

}  // namespace dtrain
