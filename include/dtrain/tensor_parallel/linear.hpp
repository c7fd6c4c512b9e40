#pragma once
/// @file
/// Megatron's tensor-parallel linear layers over a tensor-parallel group (a mesh's "tp" axis):
/// a layer's weight split across the group's ranks, so each holds and multiplies a slice.
///
/// - `column_parallel_linear`: W (out x in) split by rows, rank t holding output features
///   [o_t, o_t+1): Y_t = X W_t^T + b_t from the whole input. Its input passes through Megatron's
///   f: identity forward, allreduce of the input gradient backward (every slice contributes).
/// - `row_parallel_linear`: W split by columns, rank t holding input features [i_t, i_t+1):
///   Y = sum_t X_t W_t^T + b. Its partial products pass through g: allreduce forward, identity
///   backward. The bias is whole on every rank and added after the sum.
///
/// A column-parallel layer, an element-wise activation and a row-parallel layer (a transformer's
/// MLP block) need the column layer's output features and the row layer's input features split
/// the same way, and then exactly one allreduce forward (g) and one backward (f), each of
/// batch x features elements. Rows and columns are split as `slice_of` says: the same sizes on
/// every rank where the count divides, the first ranks one more where it does not.
///
/// Matrices are row-major, one sample per row. Layers accumulate their parameter gradients (as
/// stages do); the caller zeroes them. The arithmetic is the `Kernels` policy's (kernels.hpp):
/// `loop_kernels` (plain loops, the reference) by default, or a user's (a BLAS or Eigen product)
/// with the same two static functions; and so is the memory: `thrust_kernels`
/// (device_kernels.hpp) and `cublas_kernels` (cublas_kernels.hpp) keep the layer's tensors, and
/// take its inputs, in Thrust's device memory, over a collective of it (the staged communicator,
/// or NCCL).
///
/// `Collective` provides `rank()`, `size()`, `allreduce` of `T` (f and g) and `allgather` of
/// `std::int64_t`, on the kernels' memory: constructing a layer is collective, every rank of `tp`
/// building the same layer in the same order, and the ranks compare the layer's shape then (a
/// rank given another hidden size would otherwise train on, since no allreduce's length depends
/// on it).
///
/// Sequence parallelism (Korthikanti et al., 2022; `layer_options::sequence_parallel`): outside
/// the block each rank holds only its 1/t of the rows (the sequence), so the regions between blocks
/// (LayerNorm, dropout) are split too. The column layer then takes its rows and allgathers them
/// (backward: the input gradient reduce-scattered back to the rows), and the row layer
/// reduce-scatters its partial products to each rank's rows (backward: the output gradient
/// allgathered): an allgather and a reduce-scatter in place of each allreduce, the same bytes.
/// The row count must divide by t. `Collective` then also provides `allgather` and
/// `reduce_scatter` of `T`.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/reduce_op.hpp"
#include "dtrain/tensor_parallel/kernels.hpp"

namespace dtrain::tensor_parallel {

/// The part [begin, begin + size) of `count` features that rank `rank` of `ranks` holds.
struct slice {
  std::size_t begin = 0;
  std::size_t size = 0;
};

/// Splits `count` features over `ranks` ranks: ⌊count / ranks⌋ each, the first count mod ranks
/// ranks one more.
constexpr slice slice_of(std::size_t count, int rank, int ranks) noexcept {
  const auto r = static_cast<std::size_t>(rank), n = static_cast<std::size_t>(ranks);
  const std::size_t base = count / n, extra = count % n;
  return {r * base + (r < extra ? r : extra), base + (r < extra ? 1 : 0)};
}

/// Megatron's f: identity forward; backward, the sum of every rank's input gradient (a span of
/// the collective's memory).
template <class Collective, class Span>
void copy_to_tensor_parallel_backward(Collective& tp, Span input_grad) {
  if (tp.size() > 1) tp.allreduce(input_grad, reduce_op::sum);
}

/// Megatron's g: forward, the sum of every rank's partial output; identity backward.
template <class Collective, class Span>
void reduce_from_tensor_parallel_forward(Collective& tp, Span partial) {
  if (tp.size() > 1) tp.allreduce(partial, reduce_op::sum);
}

namespace detail {

inline void check_size(std::size_t got, std::size_t want, const char* what) {
  if (got != want) {
    throw error(errc::invalid_argument, std::string("tensor_parallel: ") + what + " has " + std::to_string(got) +
                                            " elements, the layer needs " + std::to_string(want));
  }
}

/// Every rank of `tp` gathers every rank's (in, out) (through `Memory`); if they differ, all raise
/// the same `invalid_argument` naming rank 0's shape and the first that differs. Collective.
template <class Memory, class Collective>
void check_same_shape(Collective& tp, std::size_t in, std::size_t out, const std::string& who) {
  const std::int64_t mine[2] = {static_cast<std::int64_t>(in), static_cast<std::int64_t>(out)};
  const std::vector<std::int64_t> all = Memory::allgather_values(tp, std::span<const std::int64_t>(mine));
  for (std::size_t r = 1; 2 * r < all.size(); ++r) {
    if (all[2 * r] == all[0] && all[2 * r + 1] == all[1]) continue;
    auto shape = [&](std::size_t k) { return std::to_string(all[2 * k]) + " -> " + std::to_string(all[2 * k + 1]); };
    throw error(errc::invalid_argument,
                who + ": the tensor-parallel group's ranks disagree on the layer's shape: rank 0 builds " + shape(0) +
                    ", rank " + std::to_string(r) + " builds " + shape(r) +
                    " (in -> out features); every rank must build the same layer");
  }
}

}  // namespace detail

/// How a tensor-parallel layer runs.
struct layer_options {
  /// The block's input (column layer) and output (row layer) are split by rows over the group.
  bool sequence_parallel = false;
};

namespace detail {

// Every rank's rows together, from this rank's `elements` (whole rows of `width`; each of the
// `ranks` ranks holds as many).
inline std::size_t whole_rows(std::size_t elements, std::size_t width, int ranks, const char* what) {
  if (width == 0) return 0;
  if (elements % width != 0) {
    throw error(errc::invalid_argument, std::string("tensor_parallel: ") + what + " of " + std::to_string(elements) +
                                            " elements is not whole rows of " + std::to_string(width));
  }
  return elements / width * static_cast<std::size_t>(ranks);
}

/// A collective sequence parallelism can run over: allgather and reduce-scatter of spans `S`
/// (and `CS`, their const form).
template <class C, class CS, class S>
concept sequence_collective = requires(C& c, CS in, S out) {
  c.allgather(in, out);
  c.reduce_scatter(in, out, reduce_op::sum);
};

// Refuses sequence parallelism over a collective without its two operations (a layer's
// constructor), so that the calls below are reached only where they compile.
template <class C, class CS, class S>
void check_sequence_collective(const layer_options& o, const char* who) {
  if (o.sequence_parallel && !sequence_collective<C, CS, S>) {
    throw error(errc::invalid_argument, std::string(who) + ": sequence parallelism needs a collective with allgather "
                                                           "and reduce_scatter of the layer's type");
  }
}
template <class C, class CS, class S>
void sequence_allgather(C& c, CS in, S out) {
  if constexpr (sequence_collective<C, CS, S>) c.allgather(in, out);
}
template <class C, class CS, class S>
void sequence_reduce_scatter(C& c, CS in, S out) {
  if constexpr (sequence_collective<C, CS, S>) c.reduce_scatter(in, out, reduce_op::sum);
}

}  // namespace detail

/// Weights and biases of one slice of a linear layer, with their gradients, in `Buffer`s of the
/// kernels' memory (`std::vector`s on the host).
template <class T, class Buffer = std::vector<T>>
struct linear_parameters {
  Buffer weight, bias, weight_grad, bias_grad;
};

namespace detail {
// What both layers keep: the kernels' memory's types, and the layer's slice of parameters.
template <class T, class Kernels>
struct layer_memory {
  using memory = memory_of<Kernels>;
  using span = typename memory::template span<T>;
  using cspan = typename memory::template span<const T>;
  using buffer = typename memory::template buffer<T>;

  static span whole(buffer& b) noexcept { return memory::whole(b); }
  static cspan view(buffer& b) noexcept { return cspan(memory::whole(b)); }
  // A work buffer of n values (contents not kept), as a span.
  static span work(buffer& b, std::size_t n) {
    memory::resize(b, n);
    return memory::whole(b);
  }
  static linear_parameters<T, buffer> allocate(std::size_t weights, std::size_t biases) {
    return {memory::template allocate<T>(weights), memory::template allocate<T>(biases),
            memory::template allocate<T>(weights), memory::template allocate<T>(biases)};
  }
};
}  // namespace detail

/// A linear layer whose output features are split over `tp` (Megatron's ColumnParallelLinear).
/// `Kernels` says where its tensors live (kernels.hpp): host memory by default.
template <class T, class Collective, class Kernels = loop_kernels>
class column_parallel_linear : detail::layer_memory<T, Kernels> {
  using base = detail::layer_memory<T, Kernels>;
  using typename base::buffer;
  using typename base::cspan;
  using typename base::memory;
  using typename base::span;

 public:
  /// Rank tp.rank()'s slice of an `in` -> `out` layer. @param tp outlives the layer.
  /// Collective over `tp`. @throws dtrain::error `invalid_argument` if the ranks' shapes differ.
  column_parallel_linear(Collective& tp, std::size_t in, std::size_t out, layer_options options = {})
      : tp_(&tp), in_(in), out_(out), mine_(slice_of(out, tp.rank(), tp.size())), options_(options) {
    detail::check_sequence_collective<Collective, cspan, span>(options, "column_parallel_linear");
    detail::check_same_shape<memory>(tp, in, out, "column_parallel_linear");
    p_ = base::allocate(mine_.size * in, mine_.size);
  }

  /// Copies this rank's rows out of the whole layer's `weight` (out x in) and `bias` (out), both
  /// in host memory.
  void load(std::span<const T> weight, std::span<const T> bias) {
    detail::check_size(weight.size(), out_ * in_, "the whole weight");
    detail::check_size(bias.size(), out_, "the whole bias");
    memory::upload(base::whole(p_.weight), weight.subspan(mine_.begin * in_, mine_.size * in_));
    memory::upload(base::whole(p_.bias), bias.subspan(mine_.begin, mine_.size));
  }

  /// y (batch x this rank's outputs) = x (batch x in, whole on every rank) W_t^T + b_t. Under
  /// sequence parallelism x is this rank's rows, allgathered first (y has every row).
  void forward(cspan x_in, span y) {
    const cspan x = whole_input(x_in);
    detail::check_size(y.size(), batch_of(x) * mine_.size, "the output");
    memory::rows(base::view(p_.bias), y, batch_of(x), false);
    Kernels::multiply_transposed(x, base::view(p_.weight), in_, mine_.size, y);
  }

  /// Adds this slice's gradients; `dx` (batch x in, may be empty) gets the whole input gradient,
  /// summed over the group (f's backward: one allreduce). Under sequence parallelism `x` and `dx`
  /// are this rank's rows: x is allgathered again (not kept from forward) and the input gradient
  /// reduce-scattered to them.
  void backward(cspan x_in, cspan dy, span dx) {
    const cspan x = whole_input(x_in);
    detail::check_size(dy.size(), batch_of(x) * mine_.size, "the output gradient");
    memory::sum_rows(dy, base::whole(p_.bias_grad), batch_of(x));
    if (!options_.sequence_parallel || dx.empty()) {
      if (!dx.empty()) detail::check_size(dx.size(), x.size(), "the input gradient");
      Kernels::linear_backward(x, dy, base::view(p_.weight), in_, mine_.size, base::whole(p_.weight_grad), dx);
      if (!dx.empty()) copy_to_tensor_parallel_backward(*tp_, dx);
      return;
    }
    detail::check_size(dx.size(), x_in.size(), "the input gradient (this rank's rows)");
    const span full = base::work(full_grad_, x.size());
    Kernels::linear_backward(x, dy, base::view(p_.weight), in_, mine_.size, base::whole(p_.weight_grad), full);
    detail::sequence_reduce_scatter(*tp_, cspan(full), dx);
  }

  /// This rank's output features of the whole layer's.
  slice outputs() const noexcept { return mine_; }
  linear_parameters<T, buffer>& parameters() noexcept { return p_; }

 private:
  std::size_t batch_of(cspan x) const noexcept { return in_ == 0 ? 0 : x.size() / in_; }

  // The input of every row: `x` itself, or under sequence parallelism every rank's rows gathered.
  cspan whole_input(cspan x) {
    if (!options_.sequence_parallel) return x;
    const span all =
        base::work(gathered_, detail::whole_rows(x.size(), in_, tp_->size(), "the input (this rank's rows)") * in_);
    detail::sequence_allgather(*tp_, x, all);
    return all;
  }

  Collective* tp_;
  std::size_t in_, out_;
  slice mine_;
  layer_options options_;
  linear_parameters<T, buffer> p_;
  buffer gathered_, full_grad_;  // sequence parallelism's work buffers, reused
};

/// A linear layer whose input features are split over `tp` (Megatron's RowParallelLinear).
/// `Kernels` says where its tensors live (kernels.hpp): host memory by default.
template <class T, class Collective, class Kernels = loop_kernels>
class row_parallel_linear : detail::layer_memory<T, Kernels> {
  using base = detail::layer_memory<T, Kernels>;
  using typename base::buffer;
  using typename base::cspan;
  using typename base::memory;
  using typename base::span;

 public:
  /// Rank tp.rank()'s slice of an `in` -> `out` layer. @param tp outlives the layer.
  /// Collective over `tp`. @throws dtrain::error `invalid_argument` if the ranks' shapes differ.
  row_parallel_linear(Collective& tp, std::size_t in, std::size_t out, layer_options options = {})
      : tp_(&tp), in_(in), out_(out), mine_(slice_of(in, tp.rank(), tp.size())), options_(options) {
    detail::check_sequence_collective<Collective, cspan, span>(options, "row_parallel_linear");
    detail::check_same_shape<memory>(tp, in, out, "row_parallel_linear");
    p_ = base::allocate(out * mine_.size, out);
  }

  /// Copies this rank's columns out of the whole layer's `weight` (out x in), and the bias, both
  /// in host memory.
  void load(std::span<const T> weight, std::span<const T> bias) {
    detail::check_size(weight.size(), out_ * in_, "the whole weight");
    detail::check_size(bias.size(), out_, "the whole bias");
    std::vector<T> columns(out_ * mine_.size);
    for (std::size_t o = 0; o < out_; ++o) {
      for (std::size_t i = 0; i < mine_.size; ++i) columns[o * mine_.size + i] = weight[o * in_ + mine_.begin + i];
    }
    memory::upload(base::whole(p_.weight), std::span<const T>(columns));
    memory::upload(base::whole(p_.bias), bias);
  }

  /// y (batch x out, whole on every rank) = sum over ranks of x_t W_t^T, plus b (g: one allreduce).
  /// Under sequence parallelism y is this rank's rows of it (g: one reduce-scatter); `x` has
  /// every row.
  void forward(cspan x, span y) {
    const std::size_t ranks = options_.sequence_parallel ? static_cast<std::size_t>(tp_->size()) : 1;
    const std::size_t batch = mine_.size == 0 ? y.size() * ranks / (out_ == 0 ? 1 : out_) : x.size() / mine_.size;
    detail::check_size(y.size() * ranks, batch * out_,
                       options_.sequence_parallel ? "the output (rows x t)" : "the output");
    detail::check_size(x.size(), batch * mine_.size, "the input (this rank's features)");
    if (batch % ranks != 0) {
      throw error(errc::invalid_argument, "tensor_parallel: " + std::to_string(batch) + " rows do not split over " +
                                              std::to_string(ranks) + " ranks (sequence parallelism)");
    }
    const span sum = options_.sequence_parallel ? base::work(full_grad_, batch * out_) : y;
    memory::zero(sum);
    Kernels::multiply_transposed(x, base::view(p_.weight), mine_.size, out_, sum);
    if (options_.sequence_parallel) {
      detail::sequence_reduce_scatter(*tp_, cspan(sum), y);
    } else {
      reduce_from_tensor_parallel_forward(*tp_, y);
    }
    memory::rows(base::view(p_.bias), y, batch / ranks, true);
  }

  /// Adds this slice's gradients (the bias's, whole, the same on every rank); `dx` gets the
  /// gradient of this rank's input features (g's backward: no communication; under sequence
  /// parallelism `dy` is this rank's rows, allgathered first).
  void backward(cspan x, cspan dy_in, span dx) {
    cspan dy = dy_in;
    if (options_.sequence_parallel) {
      const span all = base::work(gathered_, detail::whole_rows(dy_in.size(), out_, tp_->size(),
                                                                "the output gradient (this rank's rows)") * out_);
      detail::sequence_allgather(*tp_, dy_in, all);
      dy = all;
    }
    const std::size_t batch = out_ == 0 ? 0 : dy.size() / out_;
    detail::check_size(x.size(), batch * mine_.size, "the input (this rank's features)");
    if (!dx.empty()) detail::check_size(dx.size(), x.size(), "the input gradient");
    memory::sum_rows(dy, base::whole(p_.bias_grad), batch);
    Kernels::linear_backward(x, dy, base::view(p_.weight), mine_.size, out_, base::whole(p_.weight_grad), dx);
  }

  /// This rank's input features of the whole layer's.
  slice inputs() const noexcept { return mine_; }
  linear_parameters<T, buffer>& parameters() noexcept { return p_; }

 private:
  Collective* tp_;
  std::size_t in_, out_;
  slice mine_;
  layer_options options_;
  linear_parameters<T, buffer> p_;
  buffer gathered_, full_grad_;  // sequence parallelism's work buffers, reused
};

}  // namespace dtrain::tensor_parallel
