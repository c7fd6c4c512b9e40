#pragma once
/// @file
/// `sharded::whole_model<M>`: a `unit_model` holding every unit's parameters and gradients itself,
/// as a `model`. The same model then trains under stage 3, stages 1 and 2 and the allreduce
/// trainer, which is how a user compares them (and how bench/sharded_speed.py does).
///
/// <!-- frame: header_unit_model -->
/// @code
/// my_unit_model units(widths, train, seed);  // a unit_model
/// dtrain::sharded::whole_model whole(units);  // initialised as stage 3's root would
/// dtrain::allreduce::trainer trainer(comm_t(transport), dtrain::adam<float>(1e-3), whole);
/// @endcode

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "dtrain/concepts/model.hpp"
#include "dtrain/concepts/unit_model.hpp"
#include "dtrain/core/element.hpp"
#include "dtrain/core/error.hpp"

namespace dtrain::sharded {

/// `M`'s units side by side: tensor k of unit u is tensor `first(u) + k`. Backward reports a
/// unit's tensors ready when the model says the unit's gradients are final (`backward_done`), so
/// a trainer's buckets overlap the rest of the pass as with any model.
template <unit_model M>
class whole_model final : private unit_access<typename M::value_type> {
 public:
  using value_type = typename M::value_type;
  using batch_type = typename M::batch_type;

  /// Lays out `units`' tensors and fills them with `units.initialize` (in the master precision,
  /// rounded to `value_type`). Keeps a reference: `units` must outlive this object.
  explicit whole_model(M& units) : units_(&units) {
    std::vector<compute_type_t<value_type>> start;
    for (std::size_t u = 0; u < units.unit_count(); ++u) {
      first_.push_back(sizes_.size());
      const std::vector<std::size_t> sizes = units.unit_tensors(u);
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        offsets_.push_back(parameters_.size());
        sizes_.push_back(sizes[k]);
        start.assign(sizes[k], compute_type_t<value_type>{});
        units.initialize(u, k, std::span(start));
        for (const auto x : start) parameters_.push_back(element_cast<value_type>(x));
      }
    }
    first_.push_back(sizes_.size());
    gradients_.assign(parameters_.size(), value_type{});
  }
  whole_model(const whole_model&) = delete;  // the trainer keeps the tensors' addresses
  whole_model& operator=(const whole_model&) = delete;

  std::size_t tensor_count() const noexcept { return sizes_.size(); }
  std::span<value_type> parameters(std::size_t i) { return std::span(parameters_).subspan(offsets_[i], sizes_[i]); }
  std::span<value_type> gradients(std::size_t i) { return std::span(gradients_).subspan(offsets_[i], sizes_[i]); }
  /// Unit u's first tensor's index.
  std::size_t first(std::size_t u) const { return first_[u]; }
  /// Bytes of the parameters and gradients held.
  std::size_t bytes() const noexcept { return 2 * parameters_.size() * sizeof(value_type); }

  /// The unit model's pass over the held tensors; `ready(i)` for unit u's tensors at its
  /// `backward_done(u)`. @returns its loss.
  double forward_backward(const batch_type& batch, gradient_ready ready) {
    ready_ = &ready;
    struct clear {
      gradient_ready*& r;
      ~clear() { r = nullptr; }
    } on_exit{ready_};
    return units_->forward_backward(batch, *this);
  }

  /// Passed on, where the unit model scales its loss (loss_scaling).
  void set_loss_scale(double s)
    requires requires(M& m) { m.set_loss_scale(s); }
  {
    units_->set_loss_scale(s);
  }

 private:
  std::span<const value_type> parameters(std::size_t u, std::size_t k) override { return tensor(u, k, parameters_); }
  std::span<value_type> gradients(std::size_t u, std::size_t k) override { return tensor(u, k, gradients_); }
  void forward_done(std::size_t) override {}
  void backward_done(std::size_t u) override {
    for (std::size_t i = index(u, 0); i < first_[u + 1]; ++i) (*ready_)(i);
  }

  std::span<value_type> tensor(std::size_t u, std::size_t k, std::vector<value_type>& all) {
    const std::size_t i = index(u, k);
    if (i >= first_[u + 1]) missing(u, k);
    return std::span(all).subspan(offsets_[i], sizes_[i]);
  }
  // Tensor k of unit u's index; u must be a unit (k is the caller's to check).
  std::size_t index(std::size_t u, std::size_t k) const {
    if (u + 1 >= first_.size()) missing(u, k);
    return first_[u] + k;
  }
  [[noreturn]] static void missing(std::size_t u, std::size_t k) {
    throw error(errc::invalid_argument, "whole_model: the model asked for unit " + std::to_string(u) + "'s tensor " +
                                            std::to_string(k) + ", which it does not have");
  }

  M* units_;
  std::vector<value_type> parameters_, gradients_;
  std::vector<std::size_t> sizes_, offsets_, first_;
  gradient_ready* ready_ = nullptr;
};

}  // namespace dtrain::sharded
