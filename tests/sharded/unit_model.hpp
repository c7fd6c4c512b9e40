#pragma once
// A stage-3 test model: the least-squares regression of ../allreduce/linear_model.hpp run unit
// by unit. Its weights are split into units of tensors; the forward pass adds each unit's part
// of x . w to the residuals, the backward pass writes each unit's gradient, last unit first.
// It holds no weights: it reads them through the trainer's `unit_access`. Of any value type T:
// the pass computes in double from T's weights and writes each gradient, times the loss scale,
// rounded to T through its compute type (as mixed_models.hpp's reference does).

#include <cstddef>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../allreduce/linear_model.hpp"
#include "dtrain/concepts/unit_model.hpp"
#include "dtrain/core/element.hpp"

namespace dtrain::testing {

template <class T>
class basic_unit_linear_model {
 public:
  using value_type = T;
  using batch_type = std::pair<std::size_t, std::size_t>;  // [begin, end) of this rank's data

  basic_unit_linear_model(std::vector<std::vector<std::size_t>> units, const regression_data& data, double init)
      : units_(std::move(units)), data_(&data), init_(init) {}

  std::size_t unit_count() const noexcept { return units_.size(); }
  std::vector<std::size_t> unit_tensors(std::size_t u) const { return units_[u]; }
  void initialize(std::size_t, std::size_t, std::span<compute_type_t<T>> w) {
    for (auto& x : w) x = static_cast<compute_type_t<T>>(init_);
  }
  void set_loss_scale(double s) {
    scale_ = s;
    if (on_scale) on_scale(s);
  }

  double forward_backward(const batch_type& samples, unit_access<T>& units) {
    const std::size_t n = samples.second - samples.first, dim = data_->dim;
    std::vector<double> err(n);
    for (std::size_t s = 0; s < n; ++s) err[s] = -data_->y[samples.first + s];
    for (std::size_t u = 0, j0 = 0; u < units_.size(); ++u) {  // features in order, as the serial sum
      for (std::size_t k = 0; k < units_[u].size(); j0 += units_[u][k++]) {
        if (u == skip_in_forward) continue;
        const std::span<const T> w = units.parameters(u, k);
        for (std::size_t s = 0; s < n; ++s) {
          const double* x = &data_->x[(samples.first + s) * dim + j0];
          for (std::size_t j = 0; j < w.size(); ++j) err[s] += x[j] * element_cast<double>(w[j]);
        }
      }
      if (on) on("forward", u);
      units.forward_done(u);
      if (on) on("forward_done", u);
    }
    double loss = 0;
    for (double e : err) loss += 0.5 * e * e / static_cast<double>(n);
    for (std::size_t u = units_.size(), j_end = dim; u-- > 0;) {
      (void)units.parameters(u, 0);  // a real layer's backward reads its weights: gathered again
      std::size_t j0 = j_end;
      for (std::size_t k = units_[u].size(); k-- > 0;) j0 -= units_[u][k];
      j_end = j0;
      for (std::size_t k = 0; k < units_[u].size() && u != skip_gradients; j0 += units_[u][k++]) {
        const std::span<T> g = units.gradients(u, k);
        std::vector<double> sum(g.size(), 0.0);
        for (std::size_t s = 0; s < n; ++s) {
          const double* x = &data_->x[(samples.first + s) * dim + j0];
          for (std::size_t j = 0; j < g.size(); ++j) sum[j] += err[s] * x[j] / static_cast<double>(n);
        }
        for (std::size_t j = 0; j < g.size(); ++j) {
          g[j] = element_cast<T>(static_cast<compute_type_t<T>>(sum[j] * scale_));
        }
        if (overflow && overflow(passes_, u, k)) g[0] = element_cast<T>(std::numeric_limits<float>::infinity());
      }
      units.backward_done(u);
      if (on) on("backward_done", u);
    }
    ++passes_;
    return loss;
  }

  // Called at each event ("forward": the unit computed, before its forward_done; "forward_done";
  // "backward_done") with the unit, from inside the pass.
  std::function<void(const std::string& event, std::size_t u)> on;
  // A unit whose parameters the forward pass does not read (its part of x . w left out).
  std::size_t skip_in_forward = static_cast<std::size_t>(-1);
  // A unit whose gradients the backward pass never asks for (it still calls backward_done).
  std::size_t skip_gradients = static_cast<std::size_t>(-1);
  // Gradients made to overflow: tensor k of unit u gets an inf in pass `pass` (0-based) if true.
  std::function<bool(std::size_t pass, std::size_t u, std::size_t k)> overflow;
  std::function<void(double)> on_scale;  // told each scale set_loss_scale receives

 private:
  std::vector<std::vector<std::size_t>> units_;
  const regression_data* data_;
  double init_;
  double scale_ = 1;
  std::size_t passes_ = 0;
};

using unit_linear_model = basic_unit_linear_model<double>;

// The tests' units: 130 features in units of 43, 18, 60 and 9 weights (at P = 3 they pad to 45,
// 18, 60 and 9).
inline const std::vector<std::vector<std::size_t>> unit_sizes{{3, 40}, {1, 17}, {60}, {9}};
static_assert(unit_model<unit_linear_model>);
static_assert(unit_model<basic_unit_linear_model<bfloat16>>);

}  // namespace dtrain::testing
