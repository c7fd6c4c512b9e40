#pragma once
/// @file
/// `allreduce::host_backend<Model>`: the memory policy of an allreduce trainer whose tensors are
/// `std::span`s of host memory. Packing is `std::copy`, there are no streams to order, the
/// updater runs in place, and gradients may travel in 16 bits.
///
/// A trainer's backend (`basic_trainer`'s first template argument) answers, for its memory:
///  - `span`: a view of `value_type`s there; `updater_for<U>`: the updater the trainer holds;
///  - `reserve(plan)`: room to pack the largest bucket; `scratch(n)`: that room's first n;
///  - `settle(model)`: wait for work the model has enqueued (its parameters are final);
///  - `gradient_final(model, i)`: the model has produced gradient i (enqueued it, on a device);
///  - `await_gradients(tensors)`: the collective must not start before those gradients exist;
///  - `copy(to, from)` and `fence()`: pack and unpack buckets; `fence` waits for the copies;
///  - `allgather_digests(comm, mine)`: every rank's start-up digest, in host memory;
///  - `prepare(updater, elements, model)` and `update(updater, model, i, offset, step)`;
///  - `compresses` and, when it does, `allreduce_compressed<Half>(comm, flat)` and
///    `allreduce_topk(comm, flat, bucket, k)`.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <tuple>
#include <vector>

#include "dtrain/allreduce/bucket_plan.hpp"
#include "dtrain/core/element.hpp"
#include "dtrain/compress/topk.hpp"
#include "dtrain/concepts/updater.hpp"
#include "dtrain/core/reduce_op.hpp"
#include "dtrain/reduce/host.hpp"

namespace dtrain::allreduce {

template <class Model>
class host_backend {
 public:
  using value_type = typename Model::value_type;
  using span = std::span<value_type>;
  template <class Updater>
  using updater_for = Updater;

  static constexpr std::string_view trainer_name = "allreduce::trainer";
  /// Gradients may travel as float16 or bfloat16 (when the collective has those types).
  static constexpr bool compresses = true;
  static constexpr std::string_view no_compression = "this collective has no 16-bit element types";

  void reserve(const bucket_plan& plan) { scratch_.resize(plan.largest_bucket()); }
  span scratch(std::size_t n) noexcept { return span(scratch_.data(), n); }

  void settle(Model&) noexcept {}
  void gradient_final(Model&, std::size_t) noexcept {}
  void await_gradients(const std::vector<std::size_t>&) noexcept {}
  void copy(span to, span from) noexcept { std::copy(from.begin(), from.end(), to.begin()); }
  void fence() noexcept {}

  /// Tensors the compute thread can read and write: gradient accumulation, clipping and
  /// checkpoints work on them directly.
  static constexpr bool host_tensors = true;
  void zero(span g) noexcept { std::fill(g.begin(), g.end(), value_type(0)); }
  void add_to(span sum, span g) noexcept {
    for (std::size_t i = 0; i < g.size(); ++i) sum[i] += g[i];
  }
  /// g = (g + sum) * scale, and the sum starts again from zero.
  void fold_accumulated(span g, span sum, double scale) noexcept {
    const auto k = static_cast<value_type>(scale);
    for (std::size_t i = 0; i < g.size(); ++i) {
      g[i] = (g[i] + sum[i]) * k;
      sum[i] = value_type(0);
    }
  }
  double squared_norm(span g) const noexcept {
    double s = 0;
    for (value_type x : g) s += static_cast<double>(x) * static_cast<double>(x);
    return s;
  }
  void scale(span g, double factor) noexcept {
    for (value_type& x : g) x = static_cast<value_type>(x * factor);
  }

  template <class Collective>
  std::vector<std::int64_t> allgather_digests(Collective& comm, std::span<const std::int64_t> mine) {
    std::vector<std::int64_t> all(mine.size() * static_cast<std::size_t>(comm.size()));
    comm.allgather(mine, std::span<std::int64_t>(all));
    return all;
  }

  template <class Updater>
  void prepare(Updater& updater, std::size_t elements, Model&) {
    if (updater.parameters() < elements) updater.resize(elements);
  }

  /// Tensor `tensor`'s `step`-th update (1-based), its updater state at `offset`.
  template <class Updater>
  void update(Updater& updater, Model& model, std::size_t tensor, std::size_t offset, std::uint64_t step) {
    step_info info;
    info.step = step;
    updater.step(model.parameters(tensor), std::span<const value_type>(model.gradients(tensor)), offset, info);
  }

  /// Averages `flat` (bucket `bucket`'s gradients) across ranks from each rank's `k` largest
  /// entries after error feedback: the pairs are allgathered, summed in rank order (the same
  /// bits everywhere) and divided by the world size; what a rank did not send waits in its
  /// residual for the next step.
  template <class Collective>
  void allreduce_topk(Collective& comm, span flat, std::size_t bucket, std::size_t k) {
    if (topk_.size() <= bucket) topk_.resize(bucket + 1);
    if (topk_[bucket].size() != flat.size()) topk_[bucket] = topk_compressor<value_type>(flat.size());
    const auto p = static_cast<std::size_t>(comm.size());
    topk_indices_.resize(k * (p + 1));
    topk_values_.resize(k * (p + 1));
    std::span<std::int32_t> mine_i(topk_indices_.data(), k), all_i(topk_indices_.data() + k, k * p);
    std::span<value_type> mine_v(topk_values_.data(), k), all_v(topk_values_.data() + k, k * p);
    topk_[bucket].compress(flat, mine_i, mine_v);
    comm.allgather(std::span<const std::int32_t>(mine_i), all_i);
    comm.allgather(std::span<const value_type>(mine_v), all_v);
    std::fill(flat.begin(), flat.end(), value_type(0));
    for (std::size_t r = 0; r < p; ++r) {
      sparse_add<value_type>(flat, all_i.subspan(r * k, k), all_v.subspan(r * k, k));
    }
    const auto inverse = value_type(1) / static_cast<value_type>(p);
    for (value_type& x : flat) x *= inverse;
  }

  /// Averages `flat` across ranks in `Half` precision: divide first, so the 16-bit sum cannot
  /// overflow, reduce, and widen back (PyTorch's fp16_compress_hook).
  template <class Half, class Collective>
  void allreduce_compressed(Collective& comm, span flat) {
    auto& buffer = std::get<std::vector<Half>>(scratch16_);
    buffer.resize(flat.size());
    std::span<Half> packed(buffer);
    dtrain::detail::pack_scaled(flat.data(), packed.data(), flat.size(), 1.0f / static_cast<float>(comm.size()));
    comm.allreduce(packed, reduce_op::sum);
    dtrain::detail::unpack(packed.data(), flat.data(), flat.size());
  }

 private:
  std::vector<value_type> scratch_;
  std::tuple<std::vector<float16>, std::vector<bfloat16>> scratch16_;
  std::vector<topk_compressor<value_type>> topk_;  // per bucket: its residual
  std::vector<std::int32_t> topk_indices_;          // this rank's k, then every rank's
  std::vector<value_type> topk_values_;
};

}  // namespace dtrain::allreduce
