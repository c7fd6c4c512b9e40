#pragma once
/// @file
/// `allreduce::host_backend<Model>`: the memory policy of an allreduce trainer whose tensors are
/// `std::span`s of host memory. Packing is `std::copy`, there are no streams to order, the
/// updater runs in place, and gradients may travel in 16 bits.
///
/// A trainer's backend (`basic_trainer`'s first template argument) answers, for its memory:
///  - `span`: a view of `value_type`s there; `updater_for<U>`: the updater the trainer holds;
///  - `reserve(plan)`: room to pack the largest bucket; `scratch(n)`: that room's first n;
///  - `bind_thread()`: run first on the communication thread (the device the trainer uses);
///  - `settle(model)`: wait for work the model has enqueued (its parameters are final);
///  - `gradient_final(model, i)`: the model has produced gradient i (enqueued it, on a device);
///  - `await_gradients(tensors)`: the collective must not start before those gradients exist;
///  - `copy(to, from)` and `fence()`: pack and unpack buckets; `fence` waits for the copies;
///  - `allgather_digests(comm, mine)`: every rank's start-up digest, in host memory;
///  - `master(model, i)`, `publish(model, i)`, `download(model, s)` and `upload(model, s, host)`:
///    what a checkpoint saves and restores, and its host copies;
///  - `prepare(updater, elements, model)` and `update(updater, model, i, offset, step)`;
///  - `compresses` and, when it does, `allreduce_compressed<Half>(comm, flat)` and
///    `allreduce_topk(comm, flat, bucket, k)`.
///  - `memory()`: the bytes it holds (core/memory_use.hpp); `device_resident`: they, and the
///    updater's state, are device memory.

#include <algorithm>
#include <concepts>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include "dtrain/allreduce/bucket_plan.hpp"
#include "dtrain/compress/topk.hpp"
#include "dtrain/concepts/updater.hpp"
#include "dtrain/core/element.hpp"
#include "dtrain/core/memory_use.hpp"
#include "dtrain/core/reduce_op.hpp"
#include "dtrain/detail/allgather_on_host.hpp"
#include "dtrain/reduce/host.hpp"

namespace dtrain::allreduce {

template <class Model>
class host_backend {
 public:
  using value_type = typename Model::value_type;
  using span = std::span<value_type>;
  template <class Updater>
  using updater_for = Updater;
  /// The updater steps the model's own parameters (mixed_backend.hpp keeps a float copy).
  static constexpr bool mixed = false;
  using master_type = value_type;

  static constexpr std::string_view trainer_name = "allreduce::trainer";
  /// Gradients may travel as float16 or bfloat16 (when the collective has those types).
  static constexpr bool compresses = true;
  static constexpr std::string_view no_compression = "this collective has no 16-bit element types";

  void reserve(const bucket_plan& plan) { scratch_.resize(plan.largest_bucket()); }
  span scratch(std::size_t n) noexcept { return span(scratch_.data(), n); }

  void bind_thread() noexcept {}
  void settle(Model&) noexcept {}
  void gradient_final(Model&, std::size_t) noexcept {}
  void await_gradients(const std::vector<std::size_t>&) noexcept {}
  void copy(span to, span from) noexcept { std::copy(from.begin(), from.end(), to.begin()); }
  void fence() noexcept {}

  /// Tensors the compute thread can read and write: gradient accumulation, clipping and
  /// checkpoints work on them directly.
  static constexpr bool host_tensors = true;
  /// Its buffers and the updater's state are host memory.
  static constexpr bool device_resident = false;
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
  /// Scales the first `tensors` gradients to `max_norm` if their global L2 norm exceeds it
  /// (PyTorch's `clip_grad_norm_`); @returns the norm before clipping.
  double clip(Model& model, std::size_t tensors, double max_norm) {
    double squares = 0;
    for (std::size_t i = 0; i < tensors; ++i) {
      for (value_type x : model.gradients(i)) squares += static_cast<double>(x) * static_cast<double>(x);
    }
    const double norm = std::sqrt(squares);
    const double factor = max_norm / (norm + 1e-6);
    if (factor >= 1) return norm;
    for (std::size_t i = 0; i < tensors; ++i) {
      for (value_type& x : model.gradients(i)) x = static_cast<value_type>(x * factor);
    }
    return norm;
  }

  template <class Collective>
  std::vector<std::int64_t> allgather_digests(Collective& comm, std::span<const std::int64_t> mine) {
    return dtrain::detail::allgather_on_host(comm, mine);
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

  /// The parameters a checkpoint saves and restores: the model's own.
  span master(Model& model, std::size_t i) { return model.parameters(i); }
  void publish(Model&, std::size_t) noexcept {}
  /// A checkpoint's host copy of `s` (parameters or updater state), and back.
  template <class T>
  std::vector<T> download(Model&, std::span<T> s) const {
    return {s.begin(), s.end()};
  }
  template <class T>
  void upload(Model&, std::span<T> s, std::span<const T> host) const {
    std::copy(host.begin(), host.end(), s.begin());
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
    at_least(topk_indices_, k * (p + 1));
    at_least(topk_values_, k * (p + 1));
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
    at_least(buffer, flat.size());
    const std::span<Half> packed = std::span(buffer).first(flat.size());
    dtrain::detail::pack_scaled(flat.data(), packed.data(), flat.size(), 1.0f / static_cast<float>(comm.size()));
    comm.allreduce(packed, reduce_op::sum);
    dtrain::detail::unpack(packed.data(), flat.data(), flat.size());
  }

  /// What it holds: the bucket it packs, 16-bit packing, top-k residuals and exchanges.
  memory_use memory() const noexcept {
    memory_use m;
    m.buffers = scratch_.size() * sizeof(value_type) + std::get<0>(scratch16_).size() * sizeof(float16) +
                std::get<1>(scratch16_).size() * sizeof(bfloat16) + topk_indices_.size() * sizeof(std::int32_t) +
                topk_values_.size() * sizeof(value_type);
    if constexpr (std::floating_point<value_type>) {
      for (const auto& c : topk_) m.buffers += c.size() * sizeof(value_type);
    }
    return m;
  }

 private:
  // Grows `v` to exactly `n` elements where it is smaller, never shrinks it: the largest bucket's
  // room stays, and what `memory()` counts is what is allocated.
  template <class U>
  static void at_least(std::vector<U>& v, std::size_t n) {
    if (v.size() < n) v = std::vector<U>(n);
  }

  std::vector<value_type> scratch_;
  std::tuple<std::vector<float16>, std::vector<bfloat16>> scratch16_;
  struct no_topk {};  // a 16-bit model's (mixed_backend) gradients are not sparsified
  static auto topk_type() {
    if constexpr (std::floating_point<value_type>) {
      return std::type_identity<topk_compressor<value_type>>{};
    } else {
      return std::type_identity<no_topk>{};
    }
  }
  std::vector<typename decltype(topk_type())::type> topk_;  // per bucket: its residual
  std::vector<std::int32_t> topk_indices_;          // this rank's k, then every rank's
  std::vector<value_type> topk_values_;
};

}  // namespace dtrain::allreduce
