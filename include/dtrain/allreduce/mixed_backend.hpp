#pragma once
/// @file
/// `allreduce::mixed_backend<Model>`: the memory policy of an allreduce trainer whose model
/// computes in 16 bits (`bfloat16` or `float16`) in host memory: mixed precision (Micikevicius
/// et al., ICLR'18; PyTorch AMP with DDP). The model's parameters and gradients are 16-bit; the
/// backend keeps a `float` master copy of every parameter and the averaged gradient in `float`,
/// and the updater, whose state is `float` too, steps the master copy, which is then rounded
/// into the model's parameters. Each bucket's gradients are averaged in `reduce_in`'s precision:
/// widened to `float` first (`master`: each rank's 16-bit gradient summed exactly), or in the
/// model's type (`model`: half the bytes on the wire, each reduction step rounding) and widened
/// after. Per parameter a replica holds 2 + 2 bytes of model, 4 + 4 of master and gradient and
/// the updater's state (8 for Adam): 20 bytes, against 16 for an fp32 replica with Adam.
///
/// The trainer asks of it what it asks of `host_backend` (host_backend.hpp), and:
///  - `mixed`: true; `master_type`: `float`;
///  - `average_gradients(comm, b, model)`: bucket b's averaged gradients, into the master gradient;
///  - `keep_step(comm, scaler)`: the loss-scaled step's verdict, agreed by every rank;
///  - `master(model, i)` and `publish(model, i)`: tensor i's master parameters, and rounding
///    them into the model (checkpoints save and restore the master copy).

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "dtrain/allreduce/bucket_plan.hpp"
#include "dtrain/allreduce/host_backend.hpp"
#include "dtrain/concepts/updater.hpp"
#include "dtrain/core/element.hpp"
#include "dtrain/core/reduce_op.hpp"
#include "dtrain/updater/loss_scaler.hpp"

namespace dtrain::allreduce {

template <class Model>
class mixed_backend : public host_backend<Model> {
  using base = host_backend<Model>;

 public:
  using value_type = typename Model::value_type;
  using master_type = compute_type_t<value_type>;
  using span = std::span<value_type>;

  static constexpr bool mixed = true;
  static constexpr bool compresses = false;
  static constexpr std::string_view no_compression =
      "a 16-bit model's gradients travel in options.reduce_in's precision; compression is for float models";

  explicit mixed_backend(reduce_precision reduce_in = reduce_precision::master) : reduce_in_(reduce_in) {}

  void reserve(const bucket_plan& plan) {
    base::reserve(plan);
    plan_ = &plan;
    if (reduce_in_ == reduce_precision::master) wide_.resize(plan.largest_bucket());
  }

  /// The master copy starts as the model's (broadcast) parameters, widened.
  template <class Updater>
  void prepare(Updater& updater, std::size_t elements, Model& model) {
    base::prepare(updater, elements, model);
    master_.resize(elements);
    gradient_.resize(elements);
    for (std::size_t i = 0; i < plan_->tensor_count(); ++i) convert(model.parameters(i), master(model, i));
  }

  /// Averages bucket `b`'s 16-bit gradients across `comm` into the master gradient. Runs on the
  /// trainer's communication thread (or on `step`'s once that is idle), one bucket at a time.
  template <class Collective>
  void average_gradients(Collective& comm, const bucket& b, Model& model) {
    auto gradients = [&](std::size_t i) { return model.gradients(i); };
    auto averaged = [&](std::size_t i) { return master_gradient(i); };
    if (reduce_in_ == reduce_precision::model) {
      const span flat = this->scratch(b.elements);
      pack<value_type>(b, gradients, flat);
      if (comm.size() > 1) comm.allreduce(flat, reduce_op::avg);
      unpack<value_type>(b, std::span<const value_type>(flat), averaged);
    } else {
      const std::span<master_type> flat(wide_.data(), b.elements);
      pack<master_type>(b, gradients, flat);
      if (comm.size() > 1) comm.allreduce(flat, reduce_op::avg);
      unpack<master_type>(b, std::span<const master_type>(flat), averaged);
    }
  }

  /// Whether every rank's averaged gradient is finite under loss scaling, unscaled if it is.
  template <class Collective>
  bool keep_step(Collective& comm, loss_scaler& scaler) {
    return dtrain::keep_step(scaler, std::span<master_type>(gradient_), comm);
  }

  /// Tensor `tensor`'s `step`-th update (1-based) on the master copy, rounded into the model.
  template <class Updater>
  void update(Updater& updater, Model& model, std::size_t tensor, std::size_t offset, std::uint64_t step) {
    step_info info;
    info.step = step;
    updater.step(master(model, tensor), std::span<const master_type>(master_gradient(tensor)), offset, info);
    publish(model, tensor);
  }

  /// What it holds: the host backend's buffers, the widened bucket, the master copy and gradient.
  memory_use memory() const noexcept {
    memory_use m = base::memory();
    m.buffers += wide_.size() * sizeof(master_type);
    m.parameters = master_.size() * sizeof(master_type);
    m.gradients = gradient_.size() * sizeof(master_type);
    return m;
  }

  std::span<master_type> master(Model&, std::size_t i) { return part(master_, i); }
  void publish(Model& model, std::size_t i) { convert(master(model, i), model.parameters(i)); }

 private:
  std::span<master_type> master_gradient(std::size_t i) { return part(gradient_, i); }
  std::span<master_type> part(std::vector<master_type>& all, std::size_t i) {
    return std::span(all).subspan(plan_->parameter_offset(i), plan_->tensor_size(i));
  }

  reduce_precision reduce_in_;
  const bucket_plan* plan_ = nullptr;
  std::vector<master_type> wide_;      // one bucket, widened (reduced in the master precision)
  std::vector<master_type> master_;    // every parameter, laid out as the updater's state
  std::vector<master_type> gradient_;  // the averaged gradient, laid out alike
};

}  // namespace dtrain::allreduce
