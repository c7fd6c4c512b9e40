#pragma once
/// @file
/// `device_updater<Updater>`: any of dtrain's updaters, stepping parameters where Thrust's device
/// system runs: on the GPU in a CUDA build (state in device memory, work enqueued on a stream),
/// on the CPU under Thrust's CPP and OMP systems. The per-element rule is the updater's own
/// (`Updater::rule_type`), so a device step gives the bits the host updater would, up to the
/// device's floating-point library (`sqrt` and `pow` are correctly rounded or within 1-2 ulp
/// on CUDA). Link `dtrain::thrust` (and `dtrain::cuda` in a CUDA build); nvcc in a CUDA build.
///
/// <!-- frame: header_thrust_buffers -->
/// @code
/// dtrain::device_updater<dtrain::adam<float>> opt(dtrain::adam<float>(1e-3));
/// opt.resize(n);
/// opt.step(params, grads, 0, {}, stream);   // enqueued on `stream`
/// @endcode

#include <cstddef>
#include <string_view>
#include <utility>

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include "dtrain/concepts/updater.hpp"
#include "dtrain/core/config.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/cuda/thrust_space.hpp"
#include "dtrain/updater/basic_updater.hpp"

namespace dtrain {

namespace detail {
// One thread per parameter: `rule(w[i], g[i], state + i * Slots, lr)`.
template <class Rule, class T, std::size_t Slots>
struct apply_rule {
  Rule rule;
  T* w;
  const T* g;
  T* state;
  T lr;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const { rule(w[i], g[i], state + i * Slots, lr); }
};
}  // namespace detail

/// `Updater` (sgd, momentum, adagrad, rmsprop, adam, ftrl, delta) applied on Thrust's device.
template <class Updater>
  requires updater<Updater, typename Updater::value_type> && requires { typename Updater::rule_type; }
class device_updater {
 public:
  using value_type = typename Updater::value_type;
  using stream_handle = detail::thrust_space::stream_handle;
  static constexpr std::string_view name = Updater::name;
  static constexpr std::size_t state_slots = Updater::state_slots;

  explicit device_updater(Updater u) : host_(std::move(u)) {}

  /// Room for the state of `n` parameters: existing state kept, new state zero. Synchronises.
  void resize(std::size_t n, stream_handle s = {}) {
    if (n <= parameters_) return;
    detail::thrust_space::buffer<value_type> grown(n * state_slots);
    auto to = grown.span();
    if (parameters_ > 0) {
      detail::thrust_space::copy<value_type>(to.first(state_.size()), state_.span(), s);
    }
    detail::thrust_space::zero<value_type>(to.subspan(state_.size()), s);
    detail::thrust_space::synchronize(s);
    state_ = std::move(grown);
    parameters_ = n;
  }

  /// Enqueues on `s` one update of `params[i]` from `grads[i]` with the state of parameter
  /// `offset + i`. @pre equal sizes; offset + size <= parameters(); both buffers stay valid
  /// until the work on `s` is done.
  void step(thrust_buffer<value_type> params, thrust_buffer<const value_type> grads, std::size_t offset,
            step_info info, stream_handle s = {}) {
    DTRAIN_ASSERT(params.size() == grads.size(), "params and grads differ in size");
    DTRAIN_ASSERT(offset + params.size() <= parameters_, "device_updater state too small; call resize");
    if (params.empty()) return;
    const auto lr = static_cast<value_type>(host_.learning_rate() * info.lr_scale);
    detail::apply_rule<typename Updater::rule_type, value_type, state_slots> f{
        detail::rule_for_step(host_.rule(), info, name), params.data(), grads.data(),
        state_.data() + offset * state_slots, lr};
    thrust::for_each(detail::thrust_space::on(s), thrust::counting_iterator<std::size_t>(0),
                     thrust::counting_iterator<std::size_t>(params.size()), f);
  }

  std::size_t parameters() const noexcept { return parameters_; }
  /// The state, interleaved as the host updater's (`state_slots` values per parameter).
  thrust_buffer<value_type> state() noexcept { return state_.span(); }
  double learning_rate() const noexcept { return host_.learning_rate(); }
  void set_learning_rate(double lr) noexcept { host_.set_learning_rate(lr); }
  /// The wrapped host updater (its hyperparameters and learning rate; its own state is unused).
  const Updater& host() const noexcept { return host_; }

 private:
  Updater host_;
  detail::thrust_space::buffer<value_type> state_;
  std::size_t parameters_ = 0;
};

}  // namespace dtrain
