#pragma once
/// @file
/// FTRL-proximal (McMahan et al., "Ad Click Prediction: a View from the Trenches", KDD 2013,
/// Algorithm 1), per coordinate, for sparse linear models. With g the gradient, n the sum of
/// squared gradients, z the accumulated adjusted gradient, alpha the learning rate:
///   sigma = (sqrt(n + g^2) - sqrt(n)) / alpha;  z <- z + g - sigma * w;  n <- n + g^2
///   w <- 0                                                       if |z| <= l1
///   w <- -(z - sign(z) * l1) / ((beta + sqrt(n)) / alpha + l2)   otherwise
/// The weight held stands for the paper's w_t (they agree once FTRL has produced it; initial
/// weights other than zero enter through the first sigma * w only).
/// The L1 term sets rarely useful weights to exactly zero, which is what keeps a click model
/// with hundreds of millions of hashed features small.

#include <cmath>
#include <string_view>

#include "dtrain/updater/basic_updater.hpp"

namespace dtrain {

/// FTRL-proximal's per-element rule; the rate passed in is alpha.
template <std::floating_point T>
struct ftrl_rule {
  T beta, l1, l2;
  DTRAIN_HOST_DEVICE void operator()(T& w, T g, T* s, T alpha) const noexcept {
    T& z = s[0];
    T& n = s[1];
    const T n_new = n + g * g;
    const T sigma = (std::sqrt(n_new) - std::sqrt(n)) / alpha;
    z += g - sigma * w;
    n = n_new;
    if (std::fabs(z) <= l1) {
      w = T(0);
    } else {
      const T sign = z < T(0) ? T(-1) : T(1);
      w = -(z - sign * l1) / ((beta + std::sqrt(n)) / alpha + l2);
    }
  }
};

/// FTRL-proximal. State: z and n (2 slots). The learning rate is alpha; the step's `lr_scale`
/// (schedules, staleness) scales it. A model of `updater`.
template <std::floating_point T = float>
class ftrl : public basic_updater<ftrl_rule<T>, T, 2> {
 public:
  static constexpr std::string_view name = "ftrl";
  /// @param alpha learning rate  @param beta smoothing of the per-coordinate rate
  /// @param l1 L1 strength (sparsity)  @param l2 L2 strength
  explicit ftrl(double alpha = 0.1, double beta = 1.0, double l1 = 1.0, double l2 = 1.0)
      : basic_updater<ftrl_rule<T>, T, 2>(alpha, {static_cast<T>(beta), static_cast<T>(l1), static_cast<T>(l2)}) {}
};

}  // namespace dtrain
