#pragma once
/// @file
/// Dynamic loss scaling for 16-bit gradients (Micikevicius et al., "Mixed Precision Training",
/// ICLR'18; PyTorch's `GradScaler`). float16 has 5 exponent bits: small gradients underflow to
/// zero. The loss is multiplied by a scale s before backward, so every gradient is s times
/// larger, and divided by s again in the master precision before the update. A step whose
/// gradients hold an inf or a NaN (s was too large) is skipped and s is lowered; after
/// `growth_interval` good steps in a row s is raised. With s a power of two (the defaults keep
/// it one) scaling and unscaling are exact: they change no bit of a step that does not overflow.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "dtrain/core/error.hpp"
#include "dtrain/core/reduce_op.hpp"

namespace dtrain {

/// The precision a 16-bit model's gradients are averaged in (FSDP's `reduce_dtype`). A model of
/// `float` or `double` averages in its own type either way.
enum class reduce_precision : std::uint8_t {
  master,  ///< the master parameters' (`float`): each rank's 16-bit gradient summed exactly
  model,   ///< the model's own 16-bit type: half the bytes on the wire; every reduction step rounds
};
inline constexpr const char* reduce_precision_names[] = {"master", "model"};

/// How a trainer scales the loss. Off by default; the defaults are `GradScaler`'s.
struct loss_scaling {
  bool enabled = false;
  double initial_scale = 65536.0;     ///< 2^16
  double growth_factor = 2.0;         ///< > 1: the scale after `growth_interval` good steps
  double backoff_factor = 0.5;        ///< in (0, 1): the scale after a step that overflowed
  std::size_t growth_interval = 2000; ///< good steps in a row before the scale grows; at least 1
};

/// The scale and its history. Every rank must feed `update` the same verdicts (the trainers
/// agree on them with a collective) so every rank holds the same scale.
class loss_scaler {
 public:
  /// @throws dtrain::error `invalid_argument` naming the option out of range.
  explicit loss_scaler(loss_scaling options = {}) : options_(options), scale_(options.initial_scale) {
    auto bad = [](const std::string& what) { return error(errc::invalid_argument, "loss_scaling: " + what); };
    if (!options_.enabled) {
      scale_ = 1.0;
      return;
    }
    if (!(std::isfinite(scale_) && scale_ > 0)) throw bad("initial_scale " + std::to_string(scale_) + " must be > 0");
    if (!(std::isfinite(options_.growth_factor) && options_.growth_factor > 1)) {
      throw bad("growth_factor " + std::to_string(options_.growth_factor) + " must be > 1");
    }
    if (!(options_.backoff_factor > 0 && options_.backoff_factor < 1)) {
      throw bad("backoff_factor " + std::to_string(options_.backoff_factor) + " must be in (0, 1)");
    }
    if (options_.growth_interval == 0) throw bad("growth_interval must be at least 1");
  }

  bool enabled() const noexcept { return options_.enabled; }
  /// The factor the next step's loss is multiplied by (1 when scaling is off).
  double scale() const noexcept { return scale_; }
  /// Good steps in a row since the scale last changed.
  std::uint64_t good_steps() const noexcept { return good_; }

  /// After a step's gradients were checked on every rank: `finite` false lowers the scale and
  /// says to skip the step; true counts a good step and raises the scale after enough of them.
  /// @returns whether the step's update is to be applied (always, when scaling is off).
  bool update(bool finite) noexcept {
    if (!options_.enabled) return true;
    if (!finite) {
      scale_ *= options_.backoff_factor;
      good_ = 0;
      return false;
    }
    if (++good_ >= options_.growth_interval) {
      scale_ *= options_.growth_factor;
      good_ = 0;
    }
    return true;
  }

  /// Restores a scale and a count that `scale()` and `good_steps()` gave (a checkpoint's).
  void restore(double scale, std::uint64_t good_steps) noexcept {
    if (!options_.enabled) return;
    scale_ = scale;
    good_ = good_steps;
  }

 private:
  loss_scaling options_;
  double scale_;
  std::uint64_t good_ = 0;
};

/// Whether every value of `values` is finite (no inf, no NaN).
template <class T>
bool all_finite(std::span<const T> values) noexcept {
  for (const T v : values) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

/// The end of a loss-scaled step's reductions: every rank of each of `groups` learns whether any
/// rank's `gradient` (its part of the averaged gradient) holds an inf or a NaN, and `scaler`
/// takes that verdict. A good step's `gradient` is then unscaled (divided by the step's scale).
/// @returns whether to apply the update; always true when scaling is off (nothing is sent).
/// Collective over every group.
template <class T, class... Groups>
bool keep_step(loss_scaler& scaler, std::span<T> gradient, Groups&... groups) {
  if (!scaler.enabled()) return true;
  std::int64_t overflow = all_finite<T>(gradient) ? 0 : 1;
  const std::span<std::int64_t> flag(&overflow, 1);
  (groups.allreduce(flag, reduce_op::max), ...);
  const T inverse = static_cast<T>(1.0 / scaler.scale());
  if (!scaler.update(overflow == 0)) return false;
  for (T& g : gradient) g *= inverse;
  return true;
}

namespace detail {
/// Whether `Model` has the optional `set_loss_scale(double)` (concepts/model.hpp).
template <class Model>
inline constexpr bool scales_loss = requires(Model& m) { m.set_loss_scale(1.0); };

/// Tells `model` the scale of the coming step's loss, when scaling is on.
template <class Model>
void set_loss_scale(Model& model, const loss_scaler& scaler) {
  if constexpr (scales_loss<Model>) {
    if (scaler.enabled()) model.set_loss_scale(scaler.scale());
  }
}

/// @throws dtrain::error `invalid_argument` if scaling is on and `Model` cannot scale its loss.
template <class Model>
void check_loss_scaling(const loss_scaler& scaler, const std::string& who) {
  if constexpr (!scales_loss<Model>) {
    if (scaler.enabled()) {
      throw error(errc::invalid_argument, who + ": loss scaling is on, and the model has no set_loss_scale(double)");
    }
  }
}
}  // namespace detail

}  // namespace dtrain
