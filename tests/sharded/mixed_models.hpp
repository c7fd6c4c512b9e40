#pragma once
// Mixed precision under test: the regression of ../allreduce/linear_model.hpp with parameters
// and gradients of a 16-bit type, and the serial simulation its sharded training must equal.
// Both compute a replica's gradient in double from the T-rounded weights, scale it by the loss
// scale and round it to T through its compute type; the simulation then averages in the master
// precision in rank order, unscales, skips a step with an inf or NaN anywhere, and steps one
// updater over the whole master copy.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "../allreduce/linear_model.hpp"
#include "../allreduce/simulation.hpp"
#include "dtrain/concepts/model.hpp"
#include "dtrain/concepts/updater.hpp"
#include "dtrain/core/element.hpp"
#include "dtrain/updater/loss_scaler.hpp"

namespace dtrain::testing {

// A replica's gradient as both the models and the simulation write it.
template <class T>
T scaled_gradient(double g, double scale) {
  return element_cast<T>(static_cast<compute_type_t<T>>(g * scale));
}

template <class T>
class mixed_linear_model {
 public:
  using value_type = T;
  using batch_type = std::pair<std::size_t, std::size_t>;

  mixed_linear_model(const regression_data& data, double init) : data_(&data) {
    for (std::size_t i = 0, at = 0; i < tensor_sizes.size(); at += tensor_sizes[i++]) offsets_.push_back(at);
    w_.assign(dim(), element_cast<T>(static_cast<compute_type_t<T>>(init)));
    g_.resize(dim());
  }

  std::size_t tensor_count() const noexcept { return tensor_sizes.size(); }
  std::span<T> parameters(std::size_t i) { return std::span(w_).subspan(offsets_[i], tensor_sizes[i]); }
  std::span<T> gradients(std::size_t i) { return std::span(g_).subspan(offsets_[i], tensor_sizes[i]); }
  void set_loss_scale(double s) {
    scale_ = s;
    if (on_scale) on_scale(s);
  }

  double forward_backward(const batch_type& samples, gradient_ready ready) {
    std::vector<double> w(dim()), g(dim());
    for (std::size_t j = 0; j < dim(); ++j) w[j] = element_cast<double>(w_[j]);
    const double loss = least_squares_gradient(*data_, w, samples.first, samples.second, g);
    for (std::size_t j = 0; j < dim(); ++j) g_[j] = scaled_gradient<T>(g[j], scale_);
    if (overflow && overflow(passes_)) g_[overflow_at] = element_cast<T>(overflow_value);
    ++passes_;
    for (std::size_t i = tensor_sizes.size(); i-- > 0;) ready(i);
    return loss;
  }

  // The weights, widened to double.
  std::vector<double> weights() const {
    std::vector<double> out;
    for (const T v : w_) out.push_back(element_cast<double>(v));
    return out;
  }
  std::function<bool(std::size_t pass)> overflow;  // this pass's gradient `overflow_at` becomes:
  std::size_t overflow_at = 0;
  float overflow_value = std::numeric_limits<float>::infinity();
  std::function<void(double)> on_scale;  // told each scale set_loss_scale receives

 private:
  const regression_data* data_;
  std::vector<std::size_t> offsets_;
  std::vector<T> w_, g_;
  double scale_ = 1;
  std::size_t passes_ = 0;
};

static_assert(model<mixed_linear_model<bfloat16>>);

// What the simulation returns: the master weights after every step, which steps it skipped and
// the scale each step used.
template <class M>
struct mixed_run {
  std::vector<M> master;
  std::vector<bool> skipped;
  std::vector<double> scales;
};

// `p` replicas of mixed_linear_model<T> (data_of(r), batch k as the trainers' tests take it),
// `steps` steps; `overflow(k, r)` puts an inf into replica r's gradient at step k.
template <class T, class Updater>
mixed_run<compute_type_t<T>> mixed_training(int p, int steps, Updater a, loss_scaling scaling = {},
                                            std::function<bool(int step, int rank)> overflow = {}) {
  using M = compute_type_t<T>;
  std::vector<regression_data> data;
  for (int r = 0; r < p; ++r) data.push_back(data_of(r));
  mixed_run<M> run;
  run.master.assign(dim(), static_cast<M>(0.25));
  a.resize(dim());
  double scale = scaling.enabled ? scaling.initial_scale : 1.0;
  std::size_t good = 0, updates = 0;
  std::vector<double> w(dim()), g(dim());
  std::vector<M> mean(dim());
  for (int k = 0; k < steps; ++k) {
    const std::size_t begin = (static_cast<std::size_t>(k) * batch) % 400;
    for (std::size_t j = 0; j < dim(); ++j) w[j] = element_cast<double>(element_cast<T>(run.master[j]));
    std::fill(mean.begin(), mean.end(), M(0));
    for (int r = 0; r < p; ++r) {
      least_squares_gradient(data[static_cast<std::size_t>(r)], w, begin, begin + batch, g);
      for (std::size_t j = 0; j < dim(); ++j) {
        T gt = scaled_gradient<T>(g[j], scale);
        if (j == 0 && overflow && overflow(k, r)) gt = element_cast<T>(std::numeric_limits<float>::infinity());
        mean[j] += element_cast<M>(gt);
      }
    }
    for (M& x : mean) x /= static_cast<M>(p);
    run.scales.push_back(scale);
    const bool finite = std::all_of(mean.begin(), mean.end(), [](M x) { return std::isfinite(x); });
    run.skipped.push_back(scaling.enabled && !finite);
    if (run.skipped.back()) {
      scale *= scaling.backoff_factor;
      good = 0;
      continue;
    }
    if (scaling.enabled) {
      for (M& x : mean) x *= static_cast<M>(1.0 / scale);
      if (++good == scaling.growth_interval) scale *= scaling.growth_factor, good = 0;
    }
    step_info info;
    info.step = ++updates;
    a.step(std::span<M>(run.master), std::span<const M>(mean), 0, info);
  }
  return run;
}

}  // namespace dtrain::testing
