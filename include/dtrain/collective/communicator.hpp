#pragma once
/// @file
/// `communicator<Transport>`: every collective operation over any transport, with the algorithm
/// chosen per call (the cost model's choice), in blocking, `std::error_code`, nonblocking (`i`)
/// and uneven (`v`) forms; and the one-line models `ring<T>`, `halving_doubling<T>`,
/// `binomial_tree<T>`, `bruck<T>` that prefer one family.
///
/// <!-- frame: header_inproc_rank -->
/// @code
/// auto ranks = dtrain::make_inproc_group(4);           // one endpoint per thread
/// dtrain::ring<dtrain::inproc_transport> comm(std::move(ranks[r]));
/// comm.allreduce(std::span(grads), dtrain::reduce_op::avg);
/// @endcode

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <new>
#include <span>
#include <string>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtrain/collective/arguments.hpp"
#include "dtrain/collective/bruck.hpp"
#include "dtrain/collective/communicator_options.hpp"
#include "dtrain/collective/context.hpp"
#include "dtrain/collective/dissemination.hpp"
#include "dtrain/collective/double_tree.hpp"
#include "dtrain/collective/halving_doubling.hpp"
#include "dtrain/collective/linear.hpp"
#include "dtrain/collective/nonblocking_forms.hpp"
#include "dtrain/collective/pairwise.hpp"
#include "dtrain/collective/request.hpp"
#include "dtrain/collective/ring.hpp"
#include "dtrain/collective/selection.hpp"
#include "dtrain/collective/tree.hpp"
#include "dtrain/collective/uneven_forms.hpp"
#include "dtrain/collective/user_op.hpp"
#include "dtrain/concepts/reduction.hpp"
#include "dtrain/concepts/transport.hpp"
#include "dtrain/detail/error_code_forms.hpp"
#include "dtrain/detail/scratch_buffer.hpp"
#include "dtrain/flight/dump.hpp"
#include "dtrain/reduce/host.hpp"

namespace dtrain {

/// Runs the collective operations of one group over `Transport` (a model of `collective`).
/// Algorithms are chosen per call by `options().algorithms`; reductions run through `Reduction`.
/// Several threads may call one communicator; calls run one at a time, and every rank must
/// issue the same collectives in the same order (as NCCL and MPI require).
template <transport Transport, reduction Reduction = host_reduction>
class communicator : public detail::error_code_forms<communicator<Transport, Reduction>, detail::host_span>,
                     public detail::argument_checks<communicator<Transport, Reduction>>,
                     public detail::uneven_forms<communicator<Transport, Reduction>>,
                     public detail::nonblocking_forms<communicator<Transport, Reduction>> {
  static_assert(std::is_same_v<typename Transport::memory_space, host_memory>,
                "the generic algorithms read and write buffers on the host");
  using error_code_forms = detail::error_code_forms<communicator, detail::host_span>;
  friend error_code_forms;
  friend detail::uneven_forms<communicator>;
  friend detail::nonblocking_forms<communicator>;
  using checks = detail::argument_checks<communicator>;
  using checks::check, checks::check_root, checks::check_rooted_blocks, checks::check_no_overlap, checks::overlaps;

 public:
  using transport_type = Transport;
  using memory_space = host_memory;
  // Each operation's noexcept `std::error_code` form, beside the throwing one defined here.
  using error_code_forms::allgather, error_code_forms::allreduce, error_code_forms::alltoall,
      error_code_forms::barrier, error_code_forms::broadcast, error_code_forms::gather, error_code_forms::reduce,
      error_code_forms::reduce_scatter, error_code_forms::scatter;

  /// Takes this rank's transport endpoint. @throws dtrain::error if DTRAIN_ALGORITHMS or
  /// DTRAIN_COLLECTIVE_TIMEOUT_MS is set and cannot be read.
  explicit communicator(Transport transport, communicator_options options = {},
                        Reduction reduce = {})
      : transport_(std::move(transport)), options_(std::move(options)), reduce_(reduce) {
    detail::apply_environment(options_);
    options_.algorithms.model().segment_bytes = static_cast<double>(options_.segment_bytes);
    flight_group_ = flight::flight_group(transport_, options_.tag);
    flight::dumper::global().set_rank(flight_group_.world_rank);
  }
  communicator(communicator&&) = default;
  communicator& operator=(communicator&&) = default;
  /// Finishes the collectives still queued by `i` forms.
  ~communicator() { calls_.stop(); }

  int rank() const noexcept { return transport_.rank(); }
  int size() const noexcept { return transport_.size(); }
  Transport& transport() noexcept { return transport_; }
  const communicator_options& options() const noexcept { return options_; }
  /// The rules and cost model; change them identically on every rank.
  selection_table& algorithms() noexcept { return options_.algorithms; }
  /// Sets the per-call timeout.
  void set_timeout(std::chrono::milliseconds t) noexcept { options_.timeout = t; }
  /// The sequence number the next collective will carry.
  std::uint64_t sequence() const noexcept { return seq_; }
  /// The full message of the last error reported through an `std::error_code` overload.
  const std::string& last_error() const noexcept { return last_error_; }
  /// Whether an earlier failure left this communicator unusable.
  bool broken() const noexcept { return !broken_by_.empty(); }

  // --- broadcast -------------------------------------------------------------------------------

  /// Copies `root`'s `buf` into every rank's `buf`. Algorithms: binomial_tree, ring (chain).
  template <element T>
  void broadcast(std::span<T> buf, int root) {
    check_root(root, coll_op::broadcast);
    run<T>(coll_op::broadcast, reduce_op::sum, root, buf.size(), buf.size_bytes(),
           [&](auto& ctx, algorithm a) {
             if (a == algorithm::ring) {
               detail::tree_broadcast(ctx, buf, root, detail::chain);
             } else {
               detail::tree_broadcast(ctx, buf, root, detail::binomial_tree);
             }
           });
  }

  // --- reduce ----------------------------------------------------------------------------------

  /// `root`'s `out` gets the reduction of every rank's `in`; `out` is ignored on other ranks.
  /// Algorithms: binomial_tree, ring (pipelined chain).
  /// `op` is a `reduce_op` or a `user_op<T>`, here and in allreduce and reduce_scatter.
  template <element T, class Op>
    requires reducible_v<T>  // raw bytes move but do not reduce
  void reduce(std::type_identity_t<std::span<const T>> in, std::span<T> out, Op op, int root) {
    check_root(root, coll_op::reduce);
    if (rank() == root) {
      check(out.size() == in.size(), coll_op::reduce, "the root's out must have in.size() elements");
      check_no_overlap(in, out, coll_op::reduce);
    }
    with_reduction<T>(coll_op::reduce, op, [&](reduce_op rop, const auto& combine) {
      run<T>(coll_op::reduce, rop, root, in.size(), in.size_bytes(), [&](auto& ctx, algorithm a) {
        auto& scratch = scratch_for<T>();
        if (a == algorithm::ring) {
          detail::tree_reduce(ctx, in, out, root, rop, combine, scratch, detail::chain);
        } else {
          detail::tree_reduce(ctx, in, out, root, rop, combine, scratch, detail::binomial_tree);
        }
      });
    });
  }
  /// In place: the root's `buf` becomes the reduction; other ranks' `buf` is left unchanged.
  template <element T, class Op>
    requires reducible_v<T>  // raw bytes move but do not reduce
  void reduce(std::span<T> buf, Op op, int root) {
    reduce<T>(std::span<const T>(buf), buf, op, root);
  }

  // --- allreduce -------------------------------------------------------------------------------

  /// Every rank's `out` gets the reduction of every rank's `in`, bitwise identical on all ranks.
  /// Algorithms: ring, halving_doubling, recursive_doubling, binomial_tree, double_binary_tree.
  /// `algo` picks one for this call (as Gloo's `AllreduceOptions::setAlgorithm`), the same on
  /// every rank; `automatic` asks the selection table.
  /// @throws dtrain::error (invalid_argument) if `algo` is not an allreduce algorithm
  template <element T, class Op>
    requires reducible_v<T>  // raw bytes move but do not reduce
  void allreduce(std::type_identity_t<std::span<const T>> in, std::span<T> out, Op op,
                 algorithm algo = algorithm::automatic) {
    check(out.size() == in.size(), coll_op::allreduce, "in and out must have equal sizes");
    check(algo == algorithm::automatic || supports(coll_op::allreduce, algo), coll_op::allreduce,
          "the algorithm asked for does not implement allreduce");
    check_no_overlap(in, out, coll_op::allreduce);
    with_reduction<T>(coll_op::allreduce, op, [&](reduce_op rop, const auto& combine) {
      run<T>(coll_op::allreduce, rop, 0, in.size(), in.size_bytes(), algo, [&](auto& ctx, algorithm a) {
        auto& scratch = scratch_for<T>();
        const bool out_of_place = in.data() != out.data();
        if (a == algorithm::halving_doubling) {  // copies in only what it keeps
          detail::halving_doubling_allreduce(ctx, out, rop, combine, scratch, out_of_place ? in : std::span<const T>{});
          return;
        }
        if (out_of_place) std::copy(in.begin(), in.end(), out.begin());
        switch (a) {
          case algorithm::recursive_doubling:
            detail::recursive_doubling_allreduce(ctx, out, rop, combine, scratch);
            break;
          case algorithm::double_binary_tree:
            detail::double_tree_allreduce(ctx, out, rop, combine, scratch);
            break;
          case algorithm::binomial_tree:
            detail::tree_reduce(ctx, std::span<const T>(out), out, 0, rop, combine, scratch,
                                detail::binomial_tree);
            detail::tree_broadcast(ctx, out, 0, detail::binomial_tree);
            break;
          default: detail::ring_allreduce(ctx, out, rop, combine, scratch); break;
        }
      });
    });
  }
  /// In place.
  template <element T, class Op>
    requires reducible_v<T>  // raw bytes move but do not reduce
  void allreduce(std::span<T> buf, Op op, algorithm algo = algorithm::automatic) {
    allreduce<T>(std::span<const T>(buf), buf, op, algo);
  }

  // --- reduce-scatter --------------------------------------------------------------------------

  /// `in` is size() blocks of `out.size()`; rank r's `out` gets the reduction of block r.
  /// Algorithms: ring, halving_doubling.
  template <element T, class Op>
    requires reducible_v<T>  // raw bytes move but do not reduce
  void reduce_scatter(std::type_identity_t<std::span<const T>> in, std::span<T> out, Op op) {
    check(in.size() == out.size() * static_cast<std::size_t>(size()), coll_op::reduce_scatter,
          "in must hold size() * out.size() elements");
    check_no_overlap(in, out, coll_op::reduce_scatter);
    with_reduction<T>(coll_op::reduce_scatter, op, [&](reduce_op rop, const auto& combine) {
      run<T>(coll_op::reduce_scatter, rop, 0, out.size(), in.size_bytes(), [&](auto& ctx, algorithm a) {
        auto& staging = staging_for<T>();
        staging.assign(in.begin(), in.end());  // reused across calls: no page faults
        std::span<T> work(staging);
        reduce_scatter_in_place(ctx, a, work, out.size(), rop, combine);
        auto mine = work.subspan(static_cast<std::size_t>(rank()) * out.size(), out.size());
        std::copy(mine.begin(), mine.end(), out.begin());
      });
    });
  }
  /// In place: the result lands in block `rank()` of `buf`; other blocks are left unspecified.
  template <element T, class Op>
    requires reducible_v<T>  // raw bytes move but do not reduce
  void reduce_scatter(std::span<T> buf, Op op) {
    const auto p = static_cast<std::size_t>(size());
    check(buf.size() % p == 0, coll_op::reduce_scatter, "buf must hold size() equal blocks");
    with_reduction<T>(coll_op::reduce_scatter, op, [&](reduce_op rop, const auto& combine) {
      run<T>(coll_op::reduce_scatter, rop, 0, buf.size() / p, buf.size_bytes(), [&](auto& ctx, algorithm a) {
        reduce_scatter_in_place(ctx, a, buf, buf.size() / p, rop, combine);
      });
    });
  }

  // --- allgather -------------------------------------------------------------------------------

  /// `out` is size() blocks of `in.size()`; block r gets rank r's `in`. Algorithms: ring, bruck.
  template <element T>
  void allgather(std::type_identity_t<std::span<const T>> in, std::span<T> out) {
    const auto p = static_cast<std::size_t>(size());
    check(out.size() == in.size() * p, coll_op::allgather, "out must hold size() * in.size() elements");
    auto own = out.subspan(static_cast<std::size_t>(rank()) * in.size(), in.size());
    check(own.data() == in.data() || !overlaps(in, out), coll_op::allgather,
          "in overlaps out other than at block rank()");
    run<T>(coll_op::allgather, reduce_op::sum, 0, in.size(), out.size_bytes(),
           [&](auto& ctx, algorithm a) {
             if (a == algorithm::bruck) {
               detail::bruck_allgather(ctx, in, out, staging_for<T>());
             } else {
               if (own.data() != in.data()) std::copy(in.begin(), in.end(), own.begin());
               detail::ring_allgather(ctx, out, detail::uniform_offsets(in.size(), size()));
             }
           });
  }
  /// In place: each rank's contribution is already in block `rank()` of `buf`.
  template <element T>
  void allgather(std::span<T> buf) {
    const auto p = static_cast<std::size_t>(size());
    check(buf.size() % p == 0, coll_op::allgather, "buf must hold size() equal blocks");
    const std::size_t n = buf.size() / p;
    allgather<T>(std::span<const T>(buf.subspan(static_cast<std::size_t>(rank()) * n, n)), buf);
  }

  // --- gather / scatter ------------------------------------------------------------------------

  /// The root's `out` (size() blocks of `in.size()`) gets block r = rank r's `in`.
  /// Algorithms: binomial_tree, linear.
  template <element T>
  void gather(std::type_identity_t<std::span<const T>> in, std::span<T> out, int root) {
    check_rooted_blocks(coll_op::gather, root, in, out, out.size(), in.size(),
                        "the root's out must hold size() * in.size() elements");
    run<T>(coll_op::gather, reduce_op::sum, root, in.size(), in.size_bytes() * size(), [&](auto& ctx, algorithm a) {
      a == algorithm::linear ? detail::linear_gather(ctx, in, out, root, detail::uniform_offsets(in.size(), size()))
                             : detail::binomial_gather(ctx, in, out, root);
    });
  }

  /// Rank r's `out` gets block r of the root's `in` (size() blocks of `out.size()`).
  /// Algorithms: binomial_tree, linear.
  template <element T>
  void scatter(std::type_identity_t<std::span<const T>> in, std::span<T> out, int root) {
    check_rooted_blocks(coll_op::scatter, root, in, out, in.size(), out.size(),
                        "the root's in must hold size() * out.size() elements");
    run<T>(coll_op::scatter, reduce_op::sum, root, out.size(), out.size_bytes() * size(), [&](auto& ctx, algorithm a) {
      a == algorithm::linear ? detail::linear_scatter(ctx, in, out, root, detail::uniform_offsets(out.size(), size()))
                             : detail::binomial_scatter(ctx, in, out, root);
    });
  }

  // --- alltoall --------------------------------------------------------------------------------

  /// Block j of rank i's `in` becomes block i of rank j's `out`. Algorithms: pairwise, linear.
  template <element T>
  void alltoall(std::type_identity_t<std::span<const T>> in, std::span<T> out) {
    const auto p = static_cast<std::size_t>(size());
    check(in.size() == out.size() && in.size() % p == 0, coll_op::alltoall,
          "in and out must be equal and hold size() equal blocks");
    check_no_overlap(in, out, coll_op::alltoall);
    run<T>(coll_op::alltoall, reduce_op::sum, 0, in.size() / p, in.size_bytes(),
           [&](auto& ctx, algorithm a) { detail::alltoall_blocks(ctx, a, in, out); });
  }
  /// In place (through one temporary copy of `buf`).
  template <element T>
  void alltoall(std::span<T> buf) {
    const auto p = static_cast<std::size_t>(size());
    check(buf.size() % p == 0, coll_op::alltoall, "buf must hold size() equal blocks");
    run<T>(coll_op::alltoall, reduce_op::sum, 0, buf.size() / p, buf.size_bytes(), [&](auto& ctx, algorithm a) {
      auto& in = staging_for<T>();
      in.assign(buf.begin(), buf.end());
      detail::alltoall_blocks(ctx, a, std::span<const T>(in.data(), in.size()), buf);
    });
  }

  // --- barrier ---------------------------------------------------------------------------------

  /// Returns once every rank has entered the barrier. Algorithms: dissemination, binomial_tree.
  void barrier() {
    run<std::int32_t>(coll_op::barrier, reduce_op::sum, 0, 0, 0, [&](auto& ctx, algorithm a) {
      if (a == algorithm::binomial_tree) {
        detail::tree_barrier(ctx);
      } else {
        detail::dissemination_barrier(ctx);
      }
    });
  }

 private:
  using context = detail::call_context<Transport>;

  // Where the error-code forms keep the last error's text (`last_error()`).
  std::string* error_message() noexcept { return &last_error_; }

  template <class T, class Body>
  void run(coll_op op, reduce_op redop, int root, std::size_t count, std::size_t bytes, Body&& body) {
    run<T>(op, redop, root, count, bytes, algorithm::automatic, std::forward<Body>(body));
  }
  // With `pick` (not automatic): that algorithm, not the table's choice. Runs in the call's
  // turn (`calls_`): behind queued `i` calls, never beside another thread's call.
  template <class T, class Body>
  void run(coll_op op, reduce_op redop, int root, std::size_t count, std::size_t bytes, algorithm pick,
           Body&& body) {
    calls_.run([&] { run_now<T>(op, redop, root, count, bytes, pick, body); });
  }
  template <class T, class Body>
  void run_now(coll_op op, reduce_op redop, int root, std::size_t count, std::size_t bytes, algorithm pick,
               Body& body) {
    if (broken()) {
      throw error(errc::broken, "dtrain: rank " + std::to_string(rank()) + ": " +
                                    std::string(coll_op_name(op)) +
                                    " on a communicator broken by an earlier error (" +
                                    broken_by_ + "); build a new communicator");
    }
    const algorithm a = pick != algorithm::automatic ? pick : options_.algorithms.choose(op, bytes, size());
    signature sig{op, a, dtype_of_v<T>, redop, root, count, seq_++};
    flight::scoped_call flight(flight::recorder::global().start(flight_group_, sig));
    context ctx(transport_, options_.tag, sig, deadline::after(options_.timeout),
                options_.timeout, options_.segment_bytes, flight.handle());
    try {
      body(ctx, a);
      flight.completed();
    } catch (const error& e) {
      broken_by_ = e.what();
      flight::record_failure(flight, broken_by_);
      // One side finds a mismatch; the transport tells the others which calls disagreed, where
      // it can, so that every rank raises `collective_mismatch` naming both calls, not a peer
      // leaving.
      if constexpr (requires { transport_.abort(broken_by_, errc::collective_mismatch); }) {
        if (e.code() == errc::collective_mismatch) transport_.abort(e.reason(), errc::collective_mismatch);
      }
      throw;
    }
  }

  template <class T, class Combine>
  void reduce_scatter_in_place(context& ctx, algorithm a, std::span<T> buf, std::size_t block,
                               reduce_op op, const Combine& combine) {
    if (a == algorithm::halving_doubling) {
      detail::halving_doubling_reduce_scatter(ctx, buf, block, op, combine, scratch_for<T>());
      return;
    }
    ring_reduce_scatter_own(ctx, buf, detail::uniform_offsets(block, size()), op, combine);
  }

  // Ring reduce-scatter over the blocks at `offs` (reduce_scatterv's uneven ones too); this
  // rank's block, finished (`avg` divided), is returned.
  template <class T, class Combine>
  std::span<T> ring_reduce_scatter_own(context& ctx, std::span<T> buf, const std::vector<std::size_t>& offs,
                                       reduce_op op, const Combine& combine) {
    detail::ring_reduce_scatter(ctx, buf, offs, op, combine, scratch_for<T>());
    const auto mine = detail::block_of(buf, offs, rank());
    if (op == reduce_op::avg) combine.finish_average(mine, size());
    return mine;
  }

  // Calls `body(op, reduction)`: a built-in operator (checked for `T`) with `Reduction`, or a
  // user's operator as `reduce_op::custom` with its own reduction.
  template <class T, class Body>
  void with_reduction(coll_op coll, reduce_op op, Body&& body) {
    if (const char* why = refused_reduction<T>(op)) check(false, coll, why);
    body(op, reduce_);
  }
  template <class T, class F, class Body>
  void with_reduction(coll_op, const user_reduce_op<T, F>& op, Body&& body) {
    body(reduce_op::custom, detail::user_reduction<T, F>{&op.combine});
  }

  // Receive room for the algorithms.
  template <class T>
  detail::scratch_buffer<T>& scratch_for() {
    return std::get<detail::scratch_buffer<T>>(scratch_);
  }
  // Working copies of whole inputs (reduce-scatter's, Bruck's rotation, in-place alltoall's).
  template <class T>
  detail::scratch_buffer<T>& staging_for() {
    return std::get<detail::scratch_buffer<T>>(staging_);
  }

  detail::call_serializer calls_;  // first: a move finishes the source's queued calls first
  Transport transport_;
  communicator_options options_;
  Reduction reduce_;
  std::uint64_t seq_ = 0;
  flight::recorder::group_info flight_group_{};
  std::string broken_by_;
  std::string last_error_;
  template <class... T>
  using buffers_of = std::tuple<detail::scratch_buffer<T>...>;
  using buffers = buffers_of<float, double, std::int32_t, std::int64_t, float16, bfloat16, std::uint8_t,
                             std::int8_t, bool, std::byte>;
  buffers scratch_;
  buffers staging_;
};

namespace detail {
inline communicator_options preferring(communicator_options o, algorithm a) {
  o.algorithms.prefer(a);
  return o;
}
}  // namespace detail

/// A communicator that prefers the algorithm family `Family` wherever it applies (the caller's
/// own rules in `communicator_options::algorithms` still come first); the cost model picks the
/// rest. Users name it through the aliases below.
template <algorithm Family, transport Transport, reduction Reduction = host_reduction>
class family_communicator : public communicator<Transport, Reduction> {
 public:
  explicit family_communicator(Transport t, communicator_options o = {}, Reduction r = {})
      : communicator<Transport, Reduction>(std::move(t), detail::preferring(std::move(o), Family), r) {}
};

/// Ring allreduce / reduce-scatter / allgather, chain broadcast and reduce.
template <transport Transport, reduction Reduction = host_reduction>
using ring = family_communicator<algorithm::ring, Transport, Reduction>;
/// Rabenseifner allreduce and halving reduce-scatter.
template <transport Transport, reduction Reduction = host_reduction>
using halving_doubling = family_communicator<algorithm::halving_doubling, Transport, Reduction>;
/// Recursive-doubling allreduce.
template <transport Transport, reduction Reduction = host_reduction>
using recursive_doubling = family_communicator<algorithm::recursive_doubling, Transport, Reduction>;
/// Binomial-tree broadcast, reduce, gather, scatter, barrier (and reduce + broadcast allreduce).
template <transport Transport, reduction Reduction = host_reduction>
using binomial_tree = family_communicator<algorithm::binomial_tree, Transport, Reduction>;
/// Bruck allgather.
template <transport Transport, reduction Reduction = host_reduction>
using bruck = family_communicator<algorithm::bruck, Transport, Reduction>;

}  // namespace dtrain
