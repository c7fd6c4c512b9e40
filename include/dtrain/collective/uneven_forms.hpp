#pragma once
/// @file
/// The uneven (`v`) collectives of a host communicator: allgatherv, gatherv, scatterv,
/// alltoallv and reduce_scatterv, where each rank's block has its own count (MPI's v forms and
/// `MPI_Reduce_scatter`; PyTorch's `all_to_all_single` with split sizes, and `reduce_scatter`
/// with a list of tensors of different sizes). Blocks are packed: rank i's block starts where rank
/// i-1's ends, so a count list is all that describes a buffer; counts may be zero.
///
/// <!-- frame: header_inproc_comm -->
/// @code
/// std::vector<std::size_t> counts{3, 0, 5};                 // the same list on every rank
/// std::vector<float> all(8);
/// comm.allgatherv(std::span<const float>(mine), std::span(all), counts);
/// @endcode

#include <cstddef>
#include <numeric>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "dtrain/collective/linear.hpp"
#include "dtrain/collective/pairwise.hpp"
#include "dtrain/collective/ring.hpp"
#include "dtrain/concepts/element.hpp"
#include "dtrain/core/reduce_op.hpp"
#include "dtrain/core/signature.hpp"

namespace dtrain::detail {

/// Offsets of packed blocks of `counts` elements.
inline std::vector<std::size_t> packed_offsets(std::span<const std::size_t> counts) {
  std::vector<std::size_t> offs(counts.size() + 1, 0);
  std::partial_sum(counts.begin(), counts.end(), offs.begin() + 1);
  return offs;
}

/// The `v` forms of `Derived` (a host communicator), which befriends this class for its `run`
/// and argument checks.
template <class Derived>
class uneven_forms {
 public:
  /// Rank r's `in` (`counts[r]` elements) lands in block r of every rank's `out` (the sum of
  /// `counts`). `counts` has one entry per rank, the same on every rank. Algorithm: ring.
  template <element T>
  void allgatherv(std::type_identity_t<std::span<const T>> in, std::span<T> out,
                  std::span<const std::size_t> counts) {
    const auto offs = offsets(coll_op::allgatherv, counts, out.size(), "out");
    check_own(coll_op::allgatherv, counts, in.size());
    auto own = block_of(out, offs, self().rank());
    self().check(own.data() == in.data() || !self().overlaps(in, out), coll_op::allgatherv,
                 "in overlaps out other than at block rank()");
    self().template run<T>(coll_op::allgatherv, reduce_op::sum, 0, offs.back(), out.size_bytes(),
                           [&](auto& ctx, algorithm) {
                             if (own.data() != in.data()) std::copy(in.begin(), in.end(), own.begin());
                             ring_allgather(ctx, out, offs);
                           });
  }

  /// The root's `out` (the sum of `counts`) gets block r = rank r's `in` (`counts[r]` elements).
  /// `counts` is the same on every rank; `out` is ignored off the root. Algorithm: linear.
  template <element T>
  void gatherv(std::type_identity_t<std::span<const T>> in, std::span<T> out,
               std::span<const std::size_t> counts, int root) {
    self().check_root(root, coll_op::gatherv);
    const bool at_root = self().rank() == root;
    const auto offs = offsets(coll_op::gatherv, counts, at_root ? out.size() : total(counts), "the root's out");
    check_own(coll_op::gatherv, counts, in.size());
    if (at_root) self().check_no_overlap(in, out, coll_op::gatherv);
    self().template run<T>(coll_op::gatherv, reduce_op::sum, root, offs.back(), offs.back() * sizeof(T),
                           [&](auto& ctx, algorithm) { linear_gather(ctx, in, out, root, offs); });
  }

  /// Rank r's `out` (`counts[r]` elements) gets block r of the root's `in` (the sum of
  /// `counts`). `counts` is the same on every rank; `in` is ignored off the root. Algorithm: linear.
  template <element T>
  void scatterv(std::type_identity_t<std::span<const T>> in, std::span<const std::size_t> counts,
                std::span<T> out, int root) {
    self().check_root(root, coll_op::scatterv);
    const bool at_root = self().rank() == root;
    const auto offs = offsets(coll_op::scatterv, counts, at_root ? in.size() : total(counts), "the root's in");
    check_own(coll_op::scatterv, counts, out.size());
    if (at_root) self().check_no_overlap(in, out, coll_op::scatterv);
    self().template run<T>(coll_op::scatterv, reduce_op::sum, root, offs.back(), offs.back() * sizeof(T),
                           [&](auto& ctx, algorithm) { linear_scatter(ctx, in, out, root, offs); });
  }

  /// Rank r's `out` (`counts[r]` elements) gets the reduction over the ranks of block r of their
  /// `in` (the sum of `counts`). `counts` is the same on every rank. Algorithm: ring.
  template <element T, class Op>
    requires reducible_v<T>  // raw bytes move but do not reduce
  void reduce_scatterv(std::type_identity_t<std::span<const T>> in, std::span<const std::size_t> counts,
                       std::span<T> out, Op op) {
    auto& c = self();
    const auto offs = offsets(coll_op::reduce_scatterv, counts, in.size(), "in");
    check_own(coll_op::reduce_scatterv, counts, out.size());
    c.check_no_overlap(in, out, coll_op::reduce_scatterv);
    c.template with_reduction<T>(coll_op::reduce_scatterv, op, [&](reduce_op rop, const auto& combine) {
      c.template run<T>(coll_op::reduce_scatterv, rop, 0, offs.back(), in.size_bytes(), [&](auto& ctx, algorithm) {
        auto& work = c.template staging_for<T>();
        work.assign(in.begin(), in.end());  // reused across calls: no page faults
        const auto mine = c.ring_reduce_scatter_own(ctx, std::span<T>(work), offs, rop, combine);
        std::copy(mine.begin(), mine.end(), out.begin());
      });
    });
  }

  /// Block j of `in` (`send_counts[j]` elements) goes to rank j, where it is block i of `out`
  /// (`recv_counts[i]` elements) for the sender i. Rank j's `recv_counts[i]` must equal rank i's
  /// `send_counts[j]`; a difference is a typed error naming the pair. Algorithms: pairwise, linear.
  template <element T>
  void alltoallv(std::type_identity_t<std::span<const T>> in, std::span<const std::size_t> send_counts,
                 std::span<T> out, std::span<const std::size_t> recv_counts) {
    const auto send_offs = offsets(coll_op::alltoallv, send_counts, in.size(), "in");
    const auto recv_offs = offsets(coll_op::alltoallv, recv_counts, out.size(), "out");
    self().check_no_overlap(in, out, coll_op::alltoallv);
    // Counts differ between ranks, so the signature carries none; each message's size is checked.
    self().template run<T>(coll_op::alltoallv, reduce_op::sum, 0, 0, in.size_bytes(), [&](auto& ctx, algorithm a) {
      if (a == algorithm::linear) {
        linear_alltoall(ctx, in, out, send_offs, recv_offs);
      } else {
        pairwise_alltoall(ctx, in, out, send_offs, recv_offs);
      }
    });
  }

 private:
  Derived& self() noexcept { return static_cast<Derived&>(*this); }

  static std::size_t total(std::span<const std::size_t> counts) {
    return std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  }

  // Checks a count list (one entry per rank) against the buffer it describes (`whole` elements,
  // named `what`). @returns its offsets.
  std::vector<std::size_t> offsets(coll_op op, std::span<const std::size_t> counts, std::size_t whole,
                                   const char* what) {
    auto& c = self();
    c.check(counts.size() == static_cast<std::size_t>(c.size()), op, "counts must have one entry per rank");
    auto offs = packed_offsets(counts);
    if (offs.back() != whole) {
      c.check(false, op, (std::string(what) + " must hold the sum of the counts (" + std::to_string(offs.back()) +
                          " elements), not " + std::to_string(whole)).c_str());
    }
    return offs;
  }

  // This rank's own block (`mine` elements) must match its entry. @pre counts has size() entries
  void check_own(coll_op op, std::span<const std::size_t> counts, std::size_t mine) {
    self().check(counts[static_cast<std::size_t>(self().rank())] == mine, op,
                 "this rank's block must hold counts[rank()] elements");
  }
};

}  // namespace dtrain::detail
