#pragma once
/// @file
/// How a trainer groups gradient tensors into buckets, the unit of one allreduce.
///
/// Like PyTorch DDP: tensors are taken in reverse order (a backward pass finishes the last layer
/// first), a bucket closes once it holds at least its capacity, and the first bucket is small
/// so communication starts early in the backward pass.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dtrain/core/element.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/hash.hpp"

namespace dtrain::allreduce {

/// One bucket: consecutive tensors (in reverse index order) and where each sits in its buffer.
struct bucket {
  std::vector<std::size_t> tensors;  ///< tensor indices, in the order they are placed
  std::vector<std::size_t> offsets;  ///< element offset of each tensor in the bucket's buffer
  std::size_t elements = 0;          ///< total elements
};

/// The buckets of one model, and each tensor's bucket and offset in the parameter space.
class bucket_plan {
 public:
  bucket_plan() = default;

  /// Plans buckets for tensors of `sizes[i]` elements of `element_bytes` bytes each.
  /// @param first_bucket_bytes capacity of the first bucket (DDP: 1 MiB)
  /// @param bucket_bytes capacity of the others (DDP: 25 MiB)
  bucket_plan(std::span<const std::size_t> sizes, std::size_t element_bytes, std::size_t first_bucket_bytes,
              std::size_t bucket_bytes)
      : sizes_(sizes.begin(), sizes.end()), bucket_of_(sizes.size()), offset_(sizes.size()) {
    std::size_t running = 0;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      offset_[i] = running;
      running += sizes[i];
    }
    elements_ = running;
    bool open = false;
    for (std::size_t k = sizes.size(); k-- > 0;) {
      if (!open) buckets_.emplace_back();
      bucket& b = buckets_.back();
      bucket_of_[k] = buckets_.size() - 1;
      b.tensors.push_back(k);
      b.offsets.push_back(b.elements);
      b.elements += sizes[k];
      const std::size_t cap = buckets_.size() == 1 ? first_bucket_bytes : bucket_bytes;
      open = b.elements * element_bytes < cap;
    }
  }

  const std::vector<bucket>& buckets() const noexcept { return buckets_; }
  std::size_t tensor_count() const noexcept { return sizes_.size(); }
  std::size_t tensor_size(std::size_t i) const noexcept { return sizes_[i]; }
  /// Elements in the largest bucket: the size of a buffer any bucket fits in.
  std::size_t largest_bucket() const noexcept {
    std::size_t largest = 0;
    for (const bucket& b : buckets_) largest = std::max(largest, b.elements);
    return largest;
  }
  /// Total parameters; tensor i owns [parameter_offset(i), + tensor_size(i)) in the updater.
  std::size_t elements() const noexcept { return elements_; }
  std::size_t bucket_of(std::size_t tensor) const noexcept { return bucket_of_[tensor]; }
  std::size_t parameter_offset(std::size_t tensor) const noexcept { return offset_[tensor]; }

  /// A 64-bit digest of the tensor sizes and bucket boundaries: equal plans, equal digests.
  std::uint64_t fingerprint() const noexcept {
    fnv1a h;
    h.word(sizes_.size());
    for (std::size_t s : sizes_) h.word(s);
    for (const bucket& b : buckets_) h.word(b.tensors.size());
    return h.value();
  }

  /// "3 buckets of 6 tensors, 235146 elements" for error messages and logs.
  std::string summary() const {
    return std::to_string(buckets_.size()) + " buckets of " + std::to_string(sizes_.size()) + " tensors, " +
           std::to_string(elements_) + " elements";
  }

 private:
  std::vector<std::size_t> sizes_, bucket_of_, offset_;
  std::vector<bucket> buckets_;
  std::size_t elements_ = 0;
};

/// Copies bucket `b`'s tensors (`tensor(i)` views tensor i) into `flat`, packed in plan order,
/// and zeroes the padding after them.
template <class T, class Tensor>
void pack(const bucket& b, Tensor&& tensor, std::span<T> flat) {
  for (std::size_t k = 0; k < b.tensors.size(); ++k) {
    const auto t = tensor(b.tensors[k]);
    convert(t, flat.subspan(b.offsets[k], t.size()));
  }
  std::fill(flat.begin() + static_cast<std::ptrdiff_t>(b.elements), flat.end(), T(0));
}

/// Copies `flat` (bucket `b` packed, as `pack` leaves it) back into its tensors.
template <class T, class Tensor>
void unpack(const bucket& b, std::span<const T> flat, Tensor&& tensor) {
  for (std::size_t k = 0; k < b.tensors.size(); ++k) {
    auto t = tensor(b.tensors[k]);
    convert(flat.subspan(b.offsets[k], t.size()), t);
  }
}

namespace detail {

/// One step's bookkeeping of which gradients the model reported ready, and which buckets are
/// complete, launched in plan order so every rank issues the same collectives in the same order.
class step_readiness {
 public:
  explicit step_readiness(const bucket_plan& plan)
      : plan_(&plan), pending_(plan.buckets().size()), reported_(plan.tensor_count()) {}

  void reset() {
    for (std::size_t b = 0; b < pending_.size(); ++b) pending_[b] = plan_->buckets()[b].tensors.size();
    std::fill(reported_.begin(), reported_.end(), false);
    next_ = 0;
    misuse_.clear();
  }

  /// Records that tensor `t` is ready; false (remembering why) if it is out of range or repeated.
  bool report(std::size_t t) {
    if (t >= reported_.size() || reported_[t]) {
      if (misuse_.empty()) {
        misuse_ =
            "the model reported tensor " + std::to_string(t) + (t >= reported_.size() ? " (out of range)" : " twice");
      }
      return false;
    }
    reported_[t] = true;
    --pending_[plan_->bucket_of(t)];
    return true;
  }

  /// The next bucket in plan order if all its tensors are ready, marking it launched; null
  /// otherwise, and always for the last bucket: the trainer reduces that one itself, once
  /// backward is over (nothing is left to overlap it with).
  const bucket* take_complete() {
    if (next_ + 1 >= pending_.size() || pending_[next_] != 0) return nullptr;
    return &plan_->buckets()[next_++];
  }
  /// The next unlaunched bucket, whatever its state (after backward, all are complete).
  const bucket* take_next() { return next_ < pending_.size() ? &plan_->buckets()[next_++] : nullptr; }

  /// The tensors not reported so far, in index order.
  std::vector<std::size_t> unreported() const {
    std::vector<std::size_t> out;
    for (std::size_t i = 0; i < reported_.size(); ++i) {
      if (!reported_[i]) out.push_back(i);
    }
    return out;
  }

  /// After backward: notes the first tensor never reported. Returns what went wrong, or "".
  const std::string& finish() {
    for (std::size_t i = 0; i < reported_.size() && misuse_.empty(); ++i) {
      if (!reported_[i]) misuse_ = "the model never reported tensor " + std::to_string(i) + "'s gradient as ready";
    }
    return misuse_;
  }

 private:
  const bucket_plan* plan_;
  std::vector<std::size_t> pending_;
  std::vector<bool> reported_;
  std::size_t next_ = 0;
  std::string misuse_;
};

/// The sizes of a model's tensors; `who` names the trainer in the error.
/// @throws dtrain::error `invalid_argument` if a tensor's parameters and gradients differ in size
template <class Model>
std::vector<std::size_t> tensor_sizes(Model& model, const std::string& who) {
  std::vector<std::size_t> sizes(model.tensor_count());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    sizes[i] = model.parameters(i).size();
    if (model.gradients(i).size() != sizes[i]) {
      throw error(errc::invalid_argument, who + ": tensor " + std::to_string(i) + " has " + std::to_string(sizes[i]) +
                                              " parameters but " + std::to_string(model.gradients(i).size()) +
                                              " gradients");
    }
  }
  return sizes;
}

/// Per bucket: whether its tensors' parameters, and their gradients, are adjacent in memory
/// (models with one flat buffer, like DDP's gradient_as_bucket_view), so it is reduced in place
/// without copies. Tensors come in reverse order, so memory runs from the bucket's last tensor.
template <class Model>
std::vector<bool> contiguous_buckets(const bucket_plan& plan, Model& model) {
  std::vector<bool> contiguous;
  for (const bucket& b : plan.buckets()) {
    bool adjacent = true;
    for (std::size_t k = 1; k < b.tensors.size(); ++k) {
      const std::size_t hi = b.tensors[k - 1], lo = b.tensors[k];
      adjacent = adjacent && model.parameters(lo).data() + model.parameters(lo).size() == model.parameters(hi).data() &&
                 model.gradients(lo).data() + model.gradients(lo).size() == model.gradients(hi).data();
    }
    contiguous.push_back(adjacent);
  }
  return contiguous;
}

}  // namespace detail

}  // namespace dtrain::allreduce
