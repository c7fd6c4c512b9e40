#pragma once
/// @file
/// Choosing an algorithm per call: an alpha-beta-gamma cost model, and a table of rules a user
/// can set that take precedence over it.
///
/// `bytes` is the size of the whole operation as nccl-tests counts it: the vector for broadcast,
/// reduce and allreduce; all p blocks for allgather, reduce-scatter, gather, scatter, alltoall.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/collective/context.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/signature.hpp"

namespace dtrain {

/// Whether `a` implements `op`.
constexpr bool supports(coll_op op, algorithm a) noexcept {
  switch (op) {
    case coll_op::broadcast:
    case coll_op::reduce: return a == algorithm::binomial_tree || a == algorithm::ring;
    case coll_op::allreduce:
      return a == algorithm::ring || a == algorithm::halving_doubling ||
             a == algorithm::recursive_doubling || a == algorithm::binomial_tree ||
             a == algorithm::double_binary_tree;
    case coll_op::allgather: return a == algorithm::ring || a == algorithm::bruck;
    case coll_op::reduce_scatter: return a == algorithm::ring || a == algorithm::halving_doubling;
    case coll_op::gather:
    case coll_op::scatter: return a == algorithm::binomial_tree || a == algorithm::linear;
    case coll_op::alltoall: return a == algorithm::pairwise || a == algorithm::linear;
    case coll_op::barrier: return a == algorithm::dissemination || a == algorithm::binomial_tree;
    case coll_op::message: return false;
    case coll_op::allgatherv:
    case coll_op::reduce_scatterv: return a == algorithm::ring;
    case coll_op::gatherv:
    case coll_op::scatterv: return a == algorithm::linear;
    case coll_op::alltoallv: return a == algorithm::pairwise || a == algorithm::linear;
  }
  return false;
}

/// Every concrete algorithm, in the order the cost model breaks ties.
inline constexpr algorithm all_algorithms[] = {
    algorithm::ring,          algorithm::halving_doubling, algorithm::recursive_doubling,
    algorithm::binomial_tree, algorithm::bruck,            algorithm::pairwise,
    algorithm::linear,        algorithm::dissemination,    algorithm::double_binary_tree};

/// Hockney's model extended with a reduction term: a message of m bytes costs alpha + m * beta,
/// reducing m bytes costs m * gamma. The defaults fit the in-process transport on a small
/// 2-core machine. Nothing in dtrain measures them for another transport yet: set alpha from a
/// small-message latency (bench_tcp_latency, or bench_collectives' smallest sizes) and beta from
/// a large transfer's bandwidth, or pin algorithms with rules (DTRAIN_ALGORITHMS).
struct cost_model {
  double alpha = 15e-6;         ///< seconds per message
  double beta = 1.0 / 4e9;      ///< seconds per byte moved
  double gamma = 1.0 / 8e9;     ///< seconds per byte reduced (or copied locally)
  double segment_bytes = 1 << 20;  ///< pipeline segment (as in communicator_options)
  /// Whether a ring's reduction of one segment runs while the next is in flight, which takes a
  /// core for each rank's reducing and another for its sending. Then only one segment's
  /// reduction per step is on the critical path, and at large sizes the ring beats
  /// halving-doubling, whose halves are reduced after they arrive (docs/algorithms.md). Set it
  /// identically on every rank, from `host_map::two_cores_per_rank` (topology/hosts.hpp).
  bool reduction_overlaps = false;

  /// Estimated seconds for `a` to run `op` over `bytes` on `p` ranks; infinity if unsupported.
  double estimate(coll_op op, algorithm a, double bytes, int p) const noexcept {
    if (!supports(op, a)) return std::numeric_limits<double>::infinity();
    op = uniform_kin(op);  // uneven blocks are costed as even ones of the same total
    if (p <= 1) return 0.0;
    const double n = bytes;
    const double P = p;
    const double lg = std::ceil(std::log2(P));
    int core = 1;
    while (core * 2 <= p) core *= 2;
    const double lg2 = std::log2(static_cast<double>(core));
    const double C = core;
    const bool folds = core != p;
    auto segments = [&](double m) { return std::max(1.0, std::ceil(m / segment_bytes)); };
    // What a ring's reduction of blocks of m bytes costs, over what it would cost unhidden.
    auto exposed = [&](double m) { return reduction_overlaps ? segments(m) : 1.0; };
    // An unsegmented send of m bytes is one message per `detail::max_message_bytes` (256 MiB).
    auto parts = [](double m) { return std::max(1.0, std::ceil(m / double(detail::max_message_bytes))); };
    // Halving-doubling's exchanges of n/2, n/4, ... n/C each way.
    double halving_messages = 0;
    for (int step = 1; (1 << step) <= core; ++step) halving_messages += parts(n / double(1 << step));
    const double fold = folds ? 2 * parts(n) * alpha + 2 * n * beta + n * gamma : 0.0;
    switch (op) {
      case coll_op::broadcast:
        if (a == algorithm::ring) {
          double k = segments(n);
          return (P - 2 + k) * (alpha + n / k * beta);
        }
        return lg * (segments(n) * alpha + n * beta);
      case coll_op::reduce:
        if (a == algorithm::ring) {
          double k = segments(n);
          return (P - 2 + k) * (alpha + n / k * (beta + gamma));
        }
        return lg * (segments(n) * alpha + n * (beta + gamma));
      case coll_op::allreduce:
        switch (a) {
          case algorithm::ring:
            return 2 * (P - 1) * segments(n / P) * alpha + 2 * (P - 1) / P * n * beta +
                   (P - 1) / P * n * gamma / exposed(n / P);
          case algorithm::halving_doubling:
            return 2 * halving_messages * alpha + 2 * (C - 1) / C * n * beta + (C - 1) / C * n * gamma + fold;
          case algorithm::recursive_doubling:
            return lg2 * (parts(n) * alpha + n * beta + n * gamma) + fold;
          case algorithm::double_binary_tree:
            // Up and down two trees of depth lg, each carrying n/2 in segments: an inner rank
            // sends its half up and to two children, reducing two children's halves.
            return 2 * lg * alpha + 2 * segments(n / 2) * alpha + 2 * n * beta + n * gamma;
          default:  // binomial tree reduce + broadcast
            return 2 * lg * (segments(n) * alpha + n * beta) + lg * n * gamma;
        }
      case coll_op::allgather:
        if (a == algorithm::ring) return (P - 1) * segments(n / P) * alpha + (P - 1) / P * n * beta;
        return lg * alpha + (P - 1) / P * n * beta + n * gamma;  // Bruck rotates locally
      case coll_op::reduce_scatter:
        if (a == algorithm::ring) {
          return (P - 1) * segments(n / P) * alpha + (P - 1) / P * n * (beta + gamma / exposed(n / P));
        }
        return halving_messages * alpha + (C - 1) / C * n * (beta + gamma) + fold;
      case coll_op::gather:
      case coll_op::scatter:
        if (a == algorithm::linear) return (P - 1) * alpha + (P - 1) / P * n * beta;
        return lg * alpha + (P - 1) / P * n * beta + n / 2 * gamma;  // subtree copies
      case coll_op::alltoall:
        if (a == algorithm::pairwise) return (P - 1) * (alpha + n / P * beta);
        return alpha + (P - 1) / P * n * beta * (1 + (P - 2) / P);  // all at once, contended
      case coll_op::barrier: return a == algorithm::binomial_tree ? 2 * lg * alpha : lg * alpha;
      default: break;  // message; the v forms were mapped above
    }
    return std::numeric_limits<double>::infinity();
  }
};

/// A user rule: use `algo` for `op` when the operation's size and the group size fall in range.
struct selection_rule {
  coll_op op;
  algorithm algo;
  std::size_t min_bytes = 0;
  std::size_t max_bytes = std::numeric_limits<std::size_t>::max();
  int min_ranks = 1;
  int max_ranks = std::numeric_limits<int>::max();

  bool applies(coll_op o, std::size_t bytes, int ranks) const noexcept {
    return o == op && bytes >= min_bytes && bytes <= max_bytes && ranks >= min_ranks &&
           ranks <= max_ranks;
  }
};

/// Rules first (first match wins), then the cost model's cheapest algorithm.
class selection_table {
 public:
  /// Adds a rule. @throws dtrain::error (invalid_argument) if `rule.algo` cannot run `rule.op`.
  selection_table& add(const selection_rule& rule) {
    if (!supports(rule.op, rule.algo)) {
      throw error(errc::invalid_argument,
                  "dtrain: algorithm " + std::string(algorithm_name(rule.algo)) +
                      " does not implement " + std::string(coll_op_name(rule.op)));
    }
    rules_.push_back(rule);
    return *this;
  }

  /// Always uses `a` for `op`.
  selection_table& force(coll_op op, algorithm a) { return add({op, a}); }

  /// Uses `a` for every operation it implements; the cost model picks the rest.
  selection_table& prefer(algorithm a) {
    for (int op = 0; op <= static_cast<int>(last_coll_op); ++op) {
      if (supports(static_cast<coll_op>(op), a)) force(static_cast<coll_op>(op), a);
    }
    return *this;
  }

  /// Reads rules such as "allreduce=ring,allreduce[0-65536]=recursive_doubling,
  /// alltoall[4]=linear" (bytes range in brackets; one number is a minimum). Later rules in
  /// the text take precedence, so a general rule can be refined after it.
  /// @throws dtrain::error (invalid_argument) naming the part it could not read.
  selection_table& parse(std::string_view spec) {
    std::vector<selection_rule> parsed;
    while (!spec.empty()) {
      auto comma = spec.find(',');
      std::string_view item = spec.substr(0, comma);
      spec = comma == std::string_view::npos ? std::string_view{} : spec.substr(comma + 1);
      if (item.empty()) continue;
      parsed.push_back(parse_rule(item));
    }
    for (auto it = parsed.rbegin(); it != parsed.rend(); ++it) add(*it);
    return *this;
  }

  /// The algorithm for `op` over `bytes` on `ranks` ranks.
  algorithm choose(coll_op op, std::size_t bytes, int ranks) const noexcept {
    for (const auto& r : rules_) {
      if (r.applies(op, bytes, ranks)) return r.algo;
    }
    algorithm best = algorithm::automatic;
    double best_cost = std::numeric_limits<double>::infinity();
    for (algorithm a : all_algorithms) {
      double c = model_.estimate(op, a, static_cast<double>(bytes), ranks);
      if (c < best_cost) {
        best_cost = c;
        best = a;
      }
    }
    return best;
  }

  const std::vector<selection_rule>& rules() const noexcept { return rules_; }
  cost_model& model() noexcept { return model_; }
  const cost_model& model() const noexcept { return model_; }

 private:
  static selection_rule parse_rule(std::string_view item) {
    auto bad = [&](const char* why) {
      return error(errc::invalid_argument,
                   "dtrain: cannot read algorithm rule '" + std::string(item) + "': " + why);
    };
    auto eq = item.find('=');
    if (eq == std::string_view::npos) throw bad("expected op=algorithm");
    std::string_view lhs = item.substr(0, eq);
    std::string_view algo_name = item.substr(eq + 1);
    selection_rule rule{coll_op::message, algorithm::automatic};
    auto bracket = lhs.find('[');
    std::string_view op_name = lhs.substr(0, bracket);
    if (bracket != std::string_view::npos) {
      if (lhs.back() != ']') throw bad("unclosed '['");
      std::string range(lhs.substr(bracket + 1, lhs.size() - bracket - 2));
      auto dash = range.find('-');
      char* end = nullptr;
      rule.min_bytes = std::strtoull(range.c_str(), &end, 10);
      if (dash != std::string::npos) {
        rule.max_bytes = std::strtoull(range.c_str() + dash + 1, &end, 10);
      }
      if (end == nullptr || *end != '\0' || (dash != std::string::npos && dash == 0)) {
        throw bad("expected [min] or [min-max] in bytes");
      }
    }
    bool op_found = false;
    for (int op = 0; op <= static_cast<int>(last_coll_op); ++op) {
      if (static_cast<coll_op>(op) != coll_op::message && coll_op_name(static_cast<coll_op>(op)) == op_name) {
        rule.op = static_cast<coll_op>(op);
        op_found = true;
      }
    }
    if (!op_found) throw bad("unknown collective");
    bool algo_found = false;
    for (algorithm a : all_algorithms) {
      if (algorithm_name(a) == algo_name) {
        rule.algo = a;
        algo_found = true;
      }
    }
    if (!algo_found) throw bad("unknown algorithm");
    return rule;
  }

  std::vector<selection_rule> rules_;
  cost_model model_;
};

}  // namespace dtrain
