#pragma once
/// @file
/// The signature every message carries: which collective (or request) it belongs to.
///
/// A rank compares the signature of each message it receives with the signature of the operation
/// it is running. A difference is a collective mismatch, reported with both descriptions instead
/// of hanging or reducing unrelated data.

#include <cstdint>
#include <string>
#include <string_view>

#include "dtrain/core/element.hpp"
#include "dtrain/core/reduce_op.hpp"

namespace dtrain {

/// The operations a signature can describe. `message` is plain point-to-point traffic (the
/// parameter server's requests and responses) that carries no collective semantics. The `v`
/// forms take a count per rank (uneven blocks).
enum class coll_op : std::uint8_t {
  broadcast, reduce, allreduce, allgather, reduce_scatter, gather, scatter, alltoall, barrier,
  message, allgatherv, gatherv, scatterv, alltoallv, reduce_scatterv,
};

/// The highest `coll_op` value: frames carrying a larger one are malformed.
inline constexpr coll_op last_coll_op = coll_op::reduce_scatterv;

/// The uniform collective an uneven (`v`) one generalises; any other operation itself.
constexpr coll_op uniform_kin(coll_op op) noexcept {
  switch (op) {
    case coll_op::allgatherv: return coll_op::allgather;
    case coll_op::gatherv: return coll_op::gather;
    case coll_op::scatterv: return coll_op::scatter;
    case coll_op::alltoallv: return coll_op::alltoall;
    case coll_op::reduce_scatterv: return coll_op::reduce_scatter;
    default: return op;
  }
}

/// @returns the operation's name as used in errors and bench tables.
constexpr std::string_view coll_op_name(coll_op op) noexcept {
  switch (op) {
    case coll_op::broadcast: return "broadcast";
    case coll_op::reduce: return "reduce";
    case coll_op::allreduce: return "allreduce";
    case coll_op::allgather: return "allgather";
    case coll_op::reduce_scatter: return "reduce_scatter";
    case coll_op::gather: return "gather";
    case coll_op::scatter: return "scatter";
    case coll_op::alltoall: return "alltoall";
    case coll_op::barrier: return "barrier";
    case coll_op::message: return "message";
    case coll_op::allgatherv: return "allgatherv";
    case coll_op::gatherv: return "gatherv";
    case coll_op::scatterv: return "scatterv";
    case coll_op::alltoallv: return "alltoallv";
    case coll_op::reduce_scatterv: return "reduce_scatterv";
  }
  return "unknown";
}

/// The collective algorithms dtrain implements; see docs/algorithms.md for steps and bytes.
enum class algorithm : std::uint8_t {
  automatic,           ///< chosen per call by the selection table / cost model
  ring,                ///< ring reduce-scatter + allgather, pipelined chain broadcast, ...
  halving_doubling,    ///< Rabenseifner: recursive halving reduce-scatter + doubling allgather
  recursive_doubling,  ///< whole-vector exchange with partners at doubling distance
  binomial_tree,       ///< binomial trees rooted at the root rank
  bruck,               ///< Bruck's log-step allgather
  pairwise,            ///< pairwise-exchange alltoall
  linear,              ///< the root talks to every rank directly
  dissemination,       ///< dissemination barrier
  double_binary_tree,  ///< two binary trees, each reducing and broadcasting half (NCCL 2.4)
};

/// The highest `algorithm` value: frames carrying a larger one are malformed. New algorithms
/// go last in the enum and move this mark.
inline constexpr algorithm last_algorithm = algorithm::double_binary_tree;

/// @returns the algorithm's name ("ring", "halving_doubling", ...).
constexpr std::string_view algorithm_name(algorithm a) noexcept {
  switch (a) {
    case algorithm::automatic: return "automatic";
    case algorithm::ring: return "ring";
    case algorithm::halving_doubling: return "halving_doubling";
    case algorithm::recursive_doubling: return "recursive_doubling";
    case algorithm::binomial_tree: return "binomial_tree";
    case algorithm::bruck: return "bruck";
    case algorithm::pairwise: return "pairwise";
    case algorithm::linear: return "linear";
    case algorithm::dissemination: return "dissemination";
    case algorithm::double_binary_tree: return "double_binary_tree";
  }
  return "unknown";
}

/// What a message belongs to. Fixed-size and trivially copyable so that transports can put it
/// in a frame header as is.
struct signature {
  coll_op op = coll_op::message;
  algorithm algo = algorithm::automatic;
  dtype type = dtype::float32;
  reduce_op redop = reduce_op::sum;
  std::int32_t root = 0;    ///< root rank of rooted collectives; 0 otherwise
  std::uint64_t count = 0;  ///< element count as the caller passed it (per rank where uniform;
                            ///< all ranks' total in the v forms; 0 in alltoallv)
  std::uint64_t seq = 0;    ///< the collective's sequence number on its communicator

  friend constexpr bool operator==(const signature&, const signature&) noexcept = default;
};

/// Whether the operation takes a reduction operator, i.e. whether `redop` is meaningful.
constexpr bool takes_reduce_op(coll_op op) noexcept {
  return op == coll_op::reduce || op == coll_op::allreduce || op == coll_op::reduce_scatter ||
         op == coll_op::reduce_scatterv;
}

/// Whether the operation has a root rank.
constexpr bool is_rooted(coll_op op) noexcept {
  return op == coll_op::broadcast || op == coll_op::reduce || op == coll_op::gather ||
         op == coll_op::scatter || op == coll_op::gatherv || op == coll_op::scatterv;
}

/// Describes a signature for error messages, e.g.
/// "allreduce #7 (ring, float32 sum, count 1000)".
inline std::string describe(const signature& s) {
  // Appends rather than operator+ chains: GCC 12 at -O3 warns falsely (-Wrestrict) on those.
  std::string out(coll_op_name(s.op));
  out.append(" #").append(std::to_string(s.seq)).append(" (").append(algorithm_name(s.algo));
  if (s.op != coll_op::barrier) {
    out.append(", ").append(dtype_name(s.type));
    if (takes_reduce_op(s.op)) out.append(" ").append(reduce_op_name(s.redop));
    out.append(", count ").append(std::to_string(s.count));
  }
  if (is_rooted(s.op)) out.append(", root ").append(std::to_string(s.root));
  out.append(")");
  return out;
}

}  // namespace dtrain
