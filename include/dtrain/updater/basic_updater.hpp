#pragma once
/// @file
/// The state handling every updater shares: `Slots` values per parameter, interleaved, grown on
/// demand; and the learning rate. A model derives from it and supplies one per-element rule: a
/// small, trivially copyable function object, so the same rule also runs on a GPU
/// (`device_updater`).

#include <concepts>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/concepts/updater.hpp"
#include "dtrain/core/config.hpp"
#include "dtrain/core/error.hpp"

namespace dtrain {

namespace detail {

/// `rule`, prepared for one `step` call: a rule with `for_step(t)` (Adam's bias corrections,
/// computed once per tensor rather than per element) gets `info.step`.
/// @throws dtrain::error (invalid_argument) when the rule needs the step count and has none.
template <class Rule>
Rule rule_for_step(const Rule& rule, const step_info& info, std::string_view updater) {
  if constexpr (requires { rule.for_step(info.step); }) {
    if (info.step == 0) {
      throw error(errc::invalid_argument, "dtrain: " + std::string(updater) +
                                              " needs the tensor's update count (step_info::step); the trainers "
                                              "pass it. Keys updated at their own rates (a parameter server) "
                                              "take lazy_adam, which counts per parameter");
    }
    return rule.for_step(info.step);
  } else {
    return rule;
  }
}

}  // namespace detail

/// Base of the updater models: `Rule{...}(w, g, state, lr)` updates one parameter `w` from
/// gradient `g` with a pointer to its `Slots` state values and the effective rate.
template <class Rule, std::floating_point T, std::size_t Slots>
class basic_updater {
 public:
  static constexpr std::size_t state_slots = Slots;
  using value_type = T;
  using rule_type = Rule;

  /// Room for the state of `n` parameters; existing state is kept, new state is zero.
  void resize(std::size_t n) { state_.resize(n * Slots); parameters_ = n; }

  /// One update of `params[i]` from `grads[i]` with the state of parameter `offset + i`.
  /// @pre equal sizes; offset + size <= parameters()
  void step(std::span<T> params, std::span<const T> grads, std::size_t offset, step_info info) {
    DTRAIN_ASSERT(params.size() == grads.size(), "params and grads differ in size");
    DTRAIN_ASSERT(offset + params.size() <= parameters_, "updater state too small; call resize");
    const T lr = static_cast<T>(lr_ * info.lr_scale);
    T* state = state_.data() + offset * Slots;
    const Rule rule = detail::rule_for_step(rule_, info, "this updater");
    for (std::size_t i = 0; i < params.size(); ++i) rule(params[i], grads[i], state + i * Slots, lr);
  }

  std::size_t parameters() const noexcept { return parameters_; }
  std::span<T> state() noexcept { return state_; }
  double learning_rate() const noexcept { return lr_; }
  void set_learning_rate(double lr) noexcept { lr_ = lr; }
  /// The per-element rule with this updater's hyperparameters.
  const Rule& rule() const noexcept { return rule_; }

 protected:
  basic_updater(double lr, Rule rule) : lr_(lr), rule_(rule) {}

 private:
  double lr_;
  Rule rule_;
  std::size_t parameters_ = 0;
  std::vector<T> state_;
};

}  // namespace dtrain
