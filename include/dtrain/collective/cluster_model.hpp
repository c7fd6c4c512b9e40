#pragma once
/// @file
/// How long an allreduce takes on a cluster of hosts, per algorithm, from alpha and beta per link
/// class: what `hierarchical_communicator` chooses by, and what bench/simulate_scale tabulates up
/// to P = 1024.
///
/// The model is Hockney's, with one pair of constants per link class and the link between a host
/// and the network shared by its ranks:
///  - ranks sit on hosts host-major (ranks hL .. hL+L-1 on host h, as launchers and
///    `device_mesh` place them);
///  - an algorithm is a sequence of steps; a step is a set of messages sent at once, and lasts as
///    long as its slowest link: a rank's messages inside its host cost alpha_local + m beta_local
///    each, one after the other, and the k messages that leave (or enter) a host in a step share
///    its link: k m beta_cross, plus alpha_cross for each message its busiest rank sends across;
///  - reducing m bytes costs m gamma, and every collective call a fixed `call` besides;
///  - a pipelined algorithm (the trees; the two-level allreduce's chunks) pays for its slowest
///    stage once per segment, plus the time the first segment takes to get through.
/// Where `cost_model` (selection.hpp) sees one uniform network, this one sees that halving-
/// doubling's first, largest exchanges all cross between hosts at once, and that a flat ring
/// crosses each host's link once per step.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "dtrain/collective/double_tree.hpp"
#include "dtrain/collective/halving_doubling.hpp"
#include "dtrain/collective/selection.hpp"
#include "dtrain/collective/tree.hpp"

namespace dtrain {

/// Hockney's alpha and beta per link class, and gamma. The defaults suit TCP between hosts over
/// 1 Gbit/s and loopback inside one; `hierarchical_communicator::calibrate()` measures them.
struct two_level_costs {
  double alpha_local = 10e-6, beta_local = 1.0 / 4e9;     ///< seconds per message / per byte inside a host
  double alpha_cross = 50e-6, beta_cross = 1.0 / 1.25e8;  ///< between hosts (1 Gbit/s)
  double gamma = 1.0 / 4e9;                               ///< seconds per byte reduced
  double call = 0;  ///< seconds per collective call beyond its messages (checks, deadline, wake-ups)
};

/// Hosts of `local` ranks each, `hosts` of them.
struct cluster_shape {
  int hosts = 1;
  int local = 1;
  int size() const noexcept { return hosts * local; }
};

/// The flat allreduce algorithms the model times (`cluster_model::two_levels` times the other).
inline constexpr algorithm flat_allreduce_algorithms[] = {algorithm::ring, algorithm::halving_doubling,
                                                          algorithm::recursive_doubling, algorithm::binomial_tree,
                                                          algorithm::double_binary_tree};

class cluster_model {
 public:
  /// `segment_bytes` as in communicator_options; `pipeline_bytes` as the hierarchical
  /// communicator's chunk.
  cluster_model(two_level_costs costs, cluster_shape shape, double segment_bytes = 1 << 20,
                double pipeline_bytes = 4 << 20)
      : c_(costs), shape_(shape), segment_(segment_bytes), pipeline_(pipeline_bytes) {}

  const cluster_shape& shape() const noexcept { return shape_; }
  const two_level_costs& costs() const noexcept { return c_; }

  /// Seconds for a flat allreduce of `bytes` by `a` over all ranks; infinity if `a` is not one.
  double flat(algorithm a, double bytes) const {
    if (shape_.size() <= 1) return 0;
    return c_.call + messages(a, bytes);
  }

  /// The fastest flat algorithm for `bytes` (ties to the earlier in `flat_allreduce_algorithms`).
  algorithm best_flat(double bytes) const {
    algorithm best = algorithm::ring;
    double t = std::numeric_limits<double>::infinity();
    for (algorithm a : flat_allreduce_algorithms) {
      if (const double e = flat(a, bytes); e < t) {
        t = e;
        best = a;
      }
    }
    return best;
  }

  /// Seconds for the two-level allreduce (rings inside each host, the best algorithm across
  /// hosts among ranks of one local rank, `pipeline_bytes` chunks overlapped); infinity with one
  /// host or one rank per host, where it has nothing to gain.
  double two_levels(double bytes) const {
    const int h = shape_.hosts, l = shape_.local;
    if (h < 2 || l < 2) return std::numeric_limits<double>::infinity();
    const double chunks = chunks_of(bytes);
    const double m = bytes / chunks;
    const double inside_step = c_.alpha_local + m / l * c_.beta_local;
    const double scatter = c_.call + (l - 1) * inside_step + (l - 1.0) / l * m * c_.gamma;
    const double gather = c_.call + (l - 1) * inside_step;
    const double across = across_hosts().flat(across_algorithm(bytes), m / l);
    return scatter + across + gather + (chunks - 1) * std::max(scatter + gather, across);
  }

  /// What the level across hosts runs: the fastest algorithm over one rank per host whose link
  /// carries the L cross-host allreduces at once.
  algorithm across_algorithm(double bytes) const {
    return across_hosts().best_flat(bytes / chunks_of(bytes) / shape_.local);
  }

 private:
  struct edge {
    int from, to;
  };

  // The level across hosts as a cluster of its own: one rank per host, its link shared L ways.
  cluster_model across_hosts() const {
    two_level_costs shared = c_;
    shared.beta_cross *= shape_.local;
    return cluster_model(shared, {shape_.hosts, 1}, segment_, pipeline_);
  }

  // Seconds for the messages (and reductions) of a flat allreduce by `a`; infinity if `a` is not one.
  double messages(algorithm a, double bytes) const {
    switch (a) {
      case algorithm::ring: return ring(bytes);
      case algorithm::halving_doubling: return halving_doubling(bytes);
      case algorithm::recursive_doubling: return recursive_doubling(bytes);
      case algorithm::binomial_tree: return binomial(bytes);
      case algorithm::double_binary_tree: return double_tree(bytes);
      default: return std::numeric_limits<double>::infinity();
    }
  }

  // The two-level allreduce's chunks of `bytes`.
  double chunks_of(double bytes) const { return std::max(1.0, std::ceil(bytes / pipeline_)); }

  int host(int rank) const noexcept { return rank / shape_.local; }
  double segments(double bytes) const { return std::max(1.0, std::ceil(bytes / segment_)); }

  // One step: every edge carries `bytes` at once, sent as `messages` messages each; `reduced`
  // bytes are reduced by the busiest rank.
  double step(const std::vector<edge>& edges, double bytes, double messages = 1, double reduced = 0) const {
    const int p = shape_.size();
    std::vector<int> inside(static_cast<std::size_t>(p)), across(static_cast<std::size_t>(p));
    std::vector<int> leaving(static_cast<std::size_t>(shape_.hosts)), entering(leaving);
    for (const edge& e : edges) {
      if (host(e.from) == host(e.to)) {
        ++inside[static_cast<std::size_t>(e.from)];
      } else {
        ++across[static_cast<std::size_t>(e.from)];
        ++leaving[static_cast<std::size_t>(host(e.from))];
        ++entering[static_cast<std::size_t>(host(e.to))];
      }
    }
    const double most_inside = *std::max_element(inside.begin(), inside.end());
    const double most_across = *std::max_element(across.begin(), across.end());
    const double busiest_link = std::max(*std::max_element(leaving.begin(), leaving.end()),
                                         *std::max_element(entering.begin(), entering.end()));
    const double t_inside = most_inside * (messages * c_.alpha_local + bytes * c_.beta_local);
    const double t_across = most_across * messages * c_.alpha_cross + busiest_link * bytes * c_.beta_cross;
    return std::max(t_inside, t_across) + reduced * c_.gamma;
  }

  // Ring reduce-scatter then allgather: 2(P-1) steps of n/P, each rank to the next.
  double ring(double n) const {
    const int p = shape_.size();
    std::vector<edge> next;
    for (int r = 0; r < p; ++r) next.push_back({r, (r + 1) % p});
    const double block = n / p;
    return (p - 1) * (step(next, block, segments(block), block) + step(next, block, segments(block)));
  }

  // The fold's two steps (even ranks below 2q hand their vector to the odd neighbour and get
  // the result back) around `core(f)`, the steps among the power-of-two core.
  template <class Steps>
  double with_fold(double n, Steps core) const {
    const detail::fold_shape f(shape_.size());
    double t = 0;
    if (f.folded > 0) {
      std::vector<edge> in, out;
      for (int r = 0; r < 2 * f.folded; r += 2) {
        in.push_back({r, r + 1});
        out.push_back({r + 1, r});
      }
      t += step(in, n, 1, n) + step(out, n);
    }
    return t + core(f);
  }

  // Exchanges between core ranks at distance `mask`.
  std::vector<edge> exchange(const detail::fold_shape& f, int mask) const {
    std::vector<edge> e;
    for (int c = 0; c < f.core; ++c) e.push_back({f.real_rank(c), f.real_rank(c ^ mask)});
    return e;
  }

  // Recursive halving from the farthest partner (n/2), then doubling back.
  double halving_doubling(double n) const {
    return with_fold(n, [&](const detail::fold_shape& f) {
      double t = 0;
      for (int mask = f.core / 2; mask > 0; mask /= 2) {
        const double m = n * mask / f.core;
        const auto e = exchange(f, mask);
        t += step(e, m, 1, m) + step(e, m);
      }
      return t;
    });
  }

  // The whole vector at every distance.
  double recursive_doubling(double n) const {
    return with_fold(n, [&](const detail::fold_shape& f) {
      double t = 0;
      for (int mask = 1; mask < f.core; mask *= 2) t += step(exchange(f, mask), n, 1, n);
      return t;
    });
  }

  // A pipelined pass over `trees` (each gives every rank's place): up (children to parents,
  // reducing) and/or down. Every tree edge carries a segment per stage, and a stage waits for the
  // busiest rank and link; the first segment takes the longest path from the root to a leaf to
  // get through, each way.
  double pipelined(const std::vector<std::vector<detail::tree_shape>>& trees, double n, bool up, bool down) const {
    const int p = shape_.size();
    const double seg = std::min(n, segment_);
    std::vector<edge> edges;
    std::vector<double> children(static_cast<std::size_t>(p));
    double fill = 0;
    for (const auto& tree : trees) {
      for (int r = 0; r < p; ++r) {
        const auto& node = tree[static_cast<std::size_t>(r)];
        for (int c : node.children) {
          if (up) edges.push_back({c, r});
          if (down) edges.push_back({r, c});
        }
        children[static_cast<std::size_t>(r)] += static_cast<double>(node.children.size());
        if (node.parent < 0) {
          fill = std::max(fill, (up ? longest_path(tree, r, seg, seg * c_.gamma) : 0) +
                                    (down ? longest_path(tree, r, seg, 0) : 0));
        }
      }
    }
    const double reduced = up ? *std::max_element(children.begin(), children.end()) * seg : 0;
    return (segments(n) - 1) * step(edges, seg, 1, reduced) + fill;
  }

  // The slowest way for a segment from `r` down to a leaf of `tree` (or up from it): a hop of
  // its link class per edge, plus `extra` (a reduction) per edge.
  double longest_path(const std::vector<detail::tree_shape>& tree, int r, double seg, double extra) const {
    double longest = 0;
    for (int c : tree[static_cast<std::size_t>(r)].children) {
      const double hop =
          host(c) == host(r) ? c_.alpha_local + seg * c_.beta_local : c_.alpha_cross + seg * c_.beta_cross;
      longest = std::max(longest, hop + extra + longest_path(tree, c, seg, extra));
    }
    return longest;
  }

  // Every rank's place in a tree of P ranks shaped by `shape_of(rank, P)`.
  template <class Shape>
  std::vector<detail::tree_shape> tree_of(Shape shape_of) const {
    std::vector<detail::tree_shape> t;
    for (int r = 0; r < shape_.size(); ++r) t.push_back(shape_of(r, shape_.size()));
    return t;
  }

  // Binomial reduce to rank 0, then binomial broadcast from it.
  double binomial(double n) const {
    const std::vector<std::vector<detail::tree_shape>> tree{tree_of(detail::binomial_tree)};
    return pipelined(tree, n, true, false) + pipelined(tree, n, false, true);
  }

  // Two binary trees, each reducing and broadcasting half, every pass at once.
  double double_tree(double n) const {
    return pipelined({tree_of(detail::first_btree), tree_of(detail::second_btree)}, n / 2, true, true);
  }

  two_level_costs c_;
  cluster_shape shape_;
  double segment_, pipeline_;
};

}  // namespace dtrain
