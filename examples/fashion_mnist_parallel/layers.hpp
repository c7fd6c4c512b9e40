#pragma once
// A stage's linear layers, for both stages (stage.hpp on host memory, device_stage.hpp on a
// device's): layer l of the MLP is column-parallel for even l and row-parallel for odd l
// (Megatron's MLP block pairs), tensor-parallel over the group, starting from `layer_start`'s
// weights; `Column` and `Row` are the tensor-parallel layer types of the stage's memory.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "settings.hpp"

namespace fashion_mnist {

template <class Column, class Row>
class stage_layers {
 public:
  /// Layers [first, last) of the MLP `widths`, over `tp` (which outlives them).
  template <class Collective>
  stage_layers(Collective& tp, const std::vector<int>& widths, int first, int last, std::uint64_t seed)
      : first_(first) {
    for (int l = first; l < last; ++l) {
      const auto in = static_cast<std::size_t>(widths[l]), out = static_cast<std::size_t>(widths[l + 1]);
      const auto [w, b] = layer_start(seed, l, in, out);
      slot_.push_back(l % 2 == 0 ? columns_.size() : rows_.size());
      if (l % 2 == 0) {
        columns_.emplace_back(tp, in, out);
        columns_.back().load(w, b);
      } else {
        rows_.emplace_back(tp, in, out);
        rows_.back().load(w, b);
      }
    }
  }

  Column& column_at(int l) { return columns_[slot_[static_cast<std::size_t>(l - first_)]]; }
  Row& row_at(int l) { return rows_[slot_[static_cast<std::size_t>(l - first_)]]; }
  /// Layer l's output width on this rank (a column layer's slice of it).
  std::size_t output_width(int l, const std::vector<int>& widths) {
    return l % 2 == 0 ? column_at(l).outputs().size : static_cast<std::size_t>(widths[l + 1]);
  }
  /// The stage's tensor i: layer first + i / 2's weight (even i) or bias, or its gradient.
  auto& tensor(std::size_t i, bool gradient) {
    const int l = first_ + static_cast<int>(i / 2);
    auto& p = l % 2 == 0 ? column_at(l).parameters() : row_at(l).parameters();
    return i % 2 == 0 ? (gradient ? p.weight_grad : p.weight) : (gradient ? p.bias_grad : p.bias);
  }

 private:
  int first_;
  std::vector<Column> columns_;
  std::vector<Row> rows_;
  std::vector<std::size_t> slot_;  // layer first_ + i is columns_[slot_[i]] (even) or rows_[slot_[i]]
};

}  // namespace fashion_mnist
