#pragma once
// A stage-3 test model: the least-squares regression of ../allreduce/linear_model.hpp run unit
// by unit. Its weights are split into units of tensors; the forward pass adds each unit's part
// of x . w to the residuals, the backward pass writes each unit's gradient, last unit first.
// It holds no weights: it reads them through the trainer's `unit_access`.

#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../allreduce/linear_model.hpp"
#include "dtrain/concepts/unit_model.hpp"

namespace dtrain::testing {

class unit_linear_model {
 public:
  using value_type = double;
  using batch_type = std::pair<std::size_t, std::size_t>;  // [begin, end) of this rank's data

  unit_linear_model(std::vector<std::vector<std::size_t>> units, const regression_data& data, double init)
      : units_(std::move(units)), data_(&data), init_(init) {}

  std::size_t unit_count() const noexcept { return units_.size(); }
  std::vector<std::size_t> unit_tensors(std::size_t u) const { return units_[u]; }
  void initialize(std::size_t, std::size_t, std::span<double> w) {
    for (double& x : w) x = init_;
  }

  double forward_backward(const batch_type& samples, unit_access<double>& units) {
    const std::size_t n = samples.second - samples.first, dim = data_->dim;
    std::vector<double> err(n);
    for (std::size_t s = 0; s < n; ++s) err[s] = -data_->y[samples.first + s];
    for (std::size_t u = 0, j0 = 0; u < units_.size(); ++u) {  // features in order, as the serial sum
      for (std::size_t k = 0; k < units_[u].size(); j0 += units_[u][k++]) {
        if (u == skip_in_forward) continue;
        const std::span<const double> w = units.parameters(u, k);
        for (std::size_t s = 0; s < n; ++s) {
          const double* x = &data_->x[(samples.first + s) * dim + j0];
          for (std::size_t j = 0; j < w.size(); ++j) err[s] += x[j] * w[j];
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
      for (std::size_t k = 0; k < units_[u].size(); j0 += units_[u][k++]) {
        const std::span<double> g = units.gradients(u, k);
        for (double& x : g) x = 0;
        for (std::size_t s = 0; s < n; ++s) {
          const double* x = &data_->x[(samples.first + s) * dim + j0];
          for (std::size_t j = 0; j < g.size(); ++j) g[j] += err[s] * x[j] / static_cast<double>(n);
        }
      }
      units.backward_done(u);
      if (on) on("backward_done", u);
    }
    return loss;
  }

  // Called at each event ("forward": the unit computed, before its forward_done; "forward_done";
  // "backward_done") with the unit, from inside the pass.
  std::function<void(const std::string& event, std::size_t u)> on;
  // A unit whose parameters the forward pass does not read (its part of x . w left out).
  std::size_t skip_in_forward = static_cast<std::size_t>(-1);

 private:
  std::vector<std::vector<std::size_t>> units_;
  const regression_data* data_;
  double init_;
};

static_assert(unit_model<unit_linear_model>);

}  // namespace dtrain::testing
