#pragma once
/// @file
/// Adam (Kingma and Ba 2015) with bias correction, the step count t kept per tensor (as
/// PyTorch's `Adam`), passed by the trainer in `step_info::step`:
///   m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
///   w <- w - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
/// The two corrections are computed once per tensor and step, not per element. State: m and v.
///
/// `lazy_adam` counts t per parameter instead (a third state slot), so sparse keys a parameter
/// server updates at different rates each get their own bias correction.
///
/// AdamW (Loshchilov and Hutter 2019) decays the weights apart from the gradient's moments, as
/// PyTorch's `AdamW`: w <- w - lr * wd * w, then Adam's step. (L2 decay added to an Adam
/// gradient is divided by sqrt(v) like the gradient, so large-gradient weights decay less.)

#include <cmath>
#include <cstdint>
#include <string_view>

#include "dtrain/updater/basic_updater.hpp"

namespace dtrain {

namespace detail {
// The moments' update and the step, given the two bias corrections' divisors.
template <class T>
DTRAIN_HOST_DEVICE void adam_update(T& w, T g, T& m, T& v, T lr, T b1, T b2, T eps, T c1, T c2) noexcept {
  m = b1 * m + (T(1) - b1) * g;
  v = b2 * v + (T(1) - b2) * g * g;
  w -= lr * (m / c1) / (std::sqrt(v / c2) + eps);
}
}  // namespace detail

/// Adam's per-element rule, prepared per tensor and step by `for_step(t)`.
template <std::floating_point T>
struct adam_rule {
  T b1;
  T b2;
  T eps;
  T c1 = T(1);  // 1 - b1^t
  T c2 = T(1);  // 1 - b2^t
  adam_rule for_step(std::uint64_t t) const {
    adam_rule r = *this;
    r.c1 = T(1) - static_cast<T>(std::pow(static_cast<double>(b1), static_cast<double>(t)));
    r.c2 = T(1) - static_cast<T>(std::pow(static_cast<double>(b2), static_cast<double>(t)));
    return r;
  }
  DTRAIN_HOST_DEVICE void operator()(T& w, T g, T* s, T lr) const noexcept {
    detail::adam_update(w, g, s[0], s[1], lr, b1, b2, eps, c1, c2);
  }
};

/// Adam. State: m, v (2 slots). A model of `updater`; `step` needs `step_info::step`.
template <std::floating_point T = float>
class adam : public basic_updater<adam_rule<T>, T, 2> {
 public:
  static constexpr std::string_view name = "adam";
  explicit adam(double lr = 0.001, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8)
      : basic_updater<adam_rule<T>, T, 2>(lr, {static_cast<T>(beta1), static_cast<T>(beta2), static_cast<T>(eps)}) {}
};

/// Adam's rule with the step count t in the parameter's third state slot.
template <std::floating_point T>
struct lazy_adam_rule {
  T b1;
  T b2;
  T eps;
  DTRAIN_HOST_DEVICE void operator()(T& w, T g, T* s, T lr) const noexcept {
    T& t = s[2];
    t += T(1);
    detail::adam_update(w, g, s[0], s[1], lr, b1, b2, eps, T(1) - std::pow(b1, t), T(1) - std::pow(b2, t));
  }
};

/// Adam with a step count per parameter ("lazy Adam"), for keys updated at their own rates.
/// State: m, v, t (3 slots). A model of `updater`.
template <std::floating_point T = float>
class lazy_adam : public basic_updater<lazy_adam_rule<T>, T, 3> {
 public:
  static constexpr std::string_view name = "lazy_adam";
  explicit lazy_adam(double lr = 0.001, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8)
      : basic_updater<lazy_adam_rule<T>, T, 3>(lr,
                                               {static_cast<T>(beta1), static_cast<T>(beta2), static_cast<T>(eps)}) {}
};

/// AdamW's per-element rule: decoupled decay, then Adam's.
template <std::floating_point T>
struct adamw_rule {
  adam_rule<T> adam;
  T weight_decay;
  adamw_rule for_step(std::uint64_t t) const { return {adam.for_step(t), weight_decay}; }
  DTRAIN_HOST_DEVICE void operator()(T& w, T g, T* s, T lr) const noexcept {
    w -= lr * weight_decay * w;
    adam(w, g, s, lr);
  }
};

/// AdamW. State as Adam's (m, v); `step` needs `step_info::step`. A model of `updater`.
template <std::floating_point T = float>
class adamw : public basic_updater<adamw_rule<T>, T, 2> {
 public:
  static constexpr std::string_view name = "adamw";
  /// PyTorch's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.01.
  explicit adamw(double lr = 0.001, double weight_decay = 0.01, double beta1 = 0.9, double beta2 = 0.999,
                 double eps = 1e-8)
      : basic_updater<adamw_rule<T>, T, 2>(
            lr, {{static_cast<T>(beta1), static_cast<T>(beta2), static_cast<T>(eps)}, static_cast<T>(weight_decay)}) {}
};

}  // namespace dtrain
