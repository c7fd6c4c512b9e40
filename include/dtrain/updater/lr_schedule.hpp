#pragma once
/// @file
/// `lr_schedule`: the learning rate step by step, for any trainer's `learning_rate` option: the
/// linear scaling rule of data-parallel training with gradual warm-up (Goyal et al., "Accurate,
/// Large Minibatch SGD", 2017), optionally followed by cosine decay (Loshchilov & Hutter, 2017).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numbers>

namespace dtrain {

/// The learning rate at each step. A plain value type; call it as `schedule(step)`.
///  - Warm-up: from `base_lr` at step 0 rising linearly to `base_lr * scale` at `warmup_steps`.
///  - Then `base_lr * scale`, or, when `total_steps > warmup_steps`, cosine decay from it to
///    `final_fraction` of it at `total_steps` (and that value afterwards).
struct lr_schedule {
  double base_lr = 0.1;             ///< the rate tuned for the reference batch size
  double scale = 1.0;               ///< the linear scaling rule's k: global batch / reference batch
  std::size_t warmup_steps = 0;     ///< steps of gradual warm-up
  std::size_t total_steps = 0;      ///< > warmup_steps: decay until then; otherwise constant
  double final_fraction = 0.0;      ///< the decayed rate's end, as a fraction of the peak

  /// The linear scaling rule: a rate tuned for `reference_batch` samples, used with
  /// `global_batch` samples per step, grows in proportion, reached after `warmup_steps`.
  static lr_schedule linear_scaling(double base_lr, std::size_t global_batch, std::size_t reference_batch,
                                    std::size_t warmup_steps) {
    return {base_lr, static_cast<double>(global_batch) / static_cast<double>(reference_batch), warmup_steps, 0, 0.0};
  }

  double operator()(std::size_t step) const noexcept {
    const double peak = base_lr * scale;
    if (step < warmup_steps) {
      const double t = static_cast<double>(step) / static_cast<double>(warmup_steps);
      return base_lr + (peak - base_lr) * t;
    }
    if (total_steps <= warmup_steps) return peak;
    const double t = std::min(1.0, static_cast<double>(step - warmup_steps) /
                                       static_cast<double>(total_steps - warmup_steps));
    const double floor = peak * final_fraction;
    return floor + (peak - floor) * 0.5 * (1.0 + std::cos(std::numbers::pi * t));
  }
};

}  // namespace dtrain
