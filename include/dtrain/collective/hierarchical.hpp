#pragma once
/// @file
/// `hierarchical_communicator<World>`: allreduce in two levels, for groups spread over hosts
/// whose links between hosts are slower than those inside (Horovod's and NCCL's hierarchical
/// allreduce):
///  1. reduce-scatter inside each host: local rank l holds block l of the host's sum;
///  2. allreduce of block l across hosts, among the ranks with local rank l;
///  3. allgather inside each host.
/// The buffer goes through the levels in chunks, pipelined: the links inside a host reduce and
/// gather the next and the previous chunk while the link between hosts carries this one.
/// Only 2(H-1)/H of n/L bytes per rank cross between hosts (H hosts of L ranks), where a flat
/// ring over all P = H·L ranks sends 2(P-1)/P of n across its slowest link. With hosts of unequal
/// sizes the levels are reduce to each host's first rank, allreduce among those, broadcast.
/// Every other collective runs flat on the whole group (`flat()`).
///
/// Whether the two levels beat the flat algorithms, and which flat algorithm runs otherwise, is
/// `cluster_model`'s call per size, from alpha and beta per link class (inside a host, between
/// hosts), which `calibrate()` measures; `hierarchy::always` and `never` force it, and the flat
/// communicator's own rules (`communicator_options::algorithms`) still come first.

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <mutex>
#include <span>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "dtrain/collective/cluster_model.hpp"
#include "dtrain/collective/communicator.hpp"
#include "dtrain/concepts/element.hpp"
#include "dtrain/concepts/reduction.hpp"
#include "dtrain/core/reduce_op.hpp"
#include "dtrain/topology/hosts.hpp"
#include "dtrain/transport/group.hpp"

namespace dtrain {

/// When `hierarchical_communicator::allreduce` takes two levels.
enum class hierarchy { automatic, always, never };

template <transport World, reduction Reduction = host_reduction>
class hierarchical_communicator {
 public:
  using group = process_group<World>;
  using flat_type = communicator<group, Reduction>;

  /// Collective over `world`: learns which ranks share a host (`discover_hosts`; pass
  /// `host_id` to place ranks on emulated hosts) and builds the three communicators.
  explicit hierarchical_communicator(group world, communicator_options o = {},
                                     std::string_view host_id = this_host_id(), hierarchy when = hierarchy::automatic,
                                     two_level_costs costs = {})
      : hosts_(discover_hosts(world, host_id)),
        flat_(world, o),
        local_(hosts_.local, o),
        cross_(hosts_.cross, o),
        when_(when),
        costs_(costs) {
    // The model times the levels inside a host as rings.
    local_.algorithms().force(coll_op::reduce_scatter, algorithm::ring).force(coll_op::allgather, algorithm::ring);
    // Every rank learnt the same cores per host: the flat choice may count on the ring's overlap.
    flat_.algorithms().model().reduction_overlaps = hosts_.two_cores_per_rank;
  }

  int rank() const noexcept { return flat_.rank(); }
  int size() const noexcept { return flat_.size(); }
  const host_map<World>& hosts() const noexcept { return hosts_; }
  /// The whole group, flat: every collective but the two-level allreduce.
  flat_type& flat() noexcept { return flat_; }
  const two_level_costs& costs() const noexcept { return costs_; }
  /// Sets the constants the choice is made from (the same on every rank).
  void set_costs(const two_level_costs& c) {
    costs_ = c;
    plans_.clear();
  }
  /// Forces two levels or flat, or gives the choice back to the cost model (on every rank alike).
  void set_hierarchy(hierarchy when) {
    when_ = when;
    plans_.clear();
  }
  /// The chunk of the two-level pipeline (4 MiB): smaller overlaps sooner, larger sends fewer
  /// messages. The same on every rank.
  void set_pipeline_bytes(std::size_t bytes) {
    pipeline_bytes_ = std::max<std::size_t>(bytes, 1);
    plans_.clear();
  }

  /// The model of this group's hosts with the current constants.
  cluster_model model() const {
    return cluster_model(costs_, {hosts_.hosts, hosts_.local_size}, static_cast<double>(flat_.options().segment_bytes),
                         static_cast<double>(pipeline_bytes_));
  }

  /// How an allreduce of some size runs: in two levels (and by which algorithm across hosts),
  /// or flat by `flat` (`automatic`: the flat communicator's rules decide).
  struct plan {
    bool two_levels = false;
    algorithm flat = algorithm::automatic;
    algorithm across = algorithm::automatic;
  };

  /// The plan for an allreduce of `bytes`, the same on every rank (remembered per size).
  plan plan_for(std::size_t bytes) {
    for (const auto& [b, p] : plans_) {
      if (b == bytes) return p;
    }
    if (plans_.size() >= 64) plans_.clear();
    return plans_.emplace_back(bytes, choose(bytes)).second;
  }

  /// Measures the constants on this network. Collective.
  ///  - alpha inside a host and between hosts: every rank exchanges 8 bytes with a partner (both
  ///    send, both receive) at once (local ranks 2i and 2i+1; the same local rank on hosts 2i and
  ///    2i+1), a collective's step, so the time includes what sharing the cores costs;
  ///  - beta: rank 0 alone ping-pongs `large` bytes with local rank 1 of its host, then with
  ///    the first rank of host 1 (the model itself shares a host's link among its ranks; pairs
  ///    measuring at once would not keep in step);
  ///  - gamma: rank 0 reduces `large` bytes;
  ///  - a call's fixed cost: what a 4-byte recursive-doubling allreduce on the whole group takes
  ///    beyond the model's estimate of its messages.
  /// Rank 0's constants, broadcast, become `costs()`; the cross-host alpha and beta also go into
  /// the flat communicator's cost model (for the collectives other than allreduce).
  /// @returns the constants
  two_level_costs calibrate(std::size_t large = std::size_t{1} << 22, int rounds = 5) {
    std::array<double, 5> c{costs_.alpha_local, costs_.beta_local, costs_.alpha_cross, costs_.beta_cross, costs_.gamma};
    const int me = flat_.rank(), host = hosts_.host, local = hosts_.local_rank;
    const int inside = rank_at(host, local ^ 1), across = rank_at(host ^ 1, local);
    auto latency = [&](int partner, double& into) {
      if (partner >= 0) into = exchange(partner, 8, 20 * rounds);
    };
    auto bandwidth = [&](int partner, double alpha, double& into) {  // rank 0 and its partner only
      if (me == 0 && partner >= 0) {
        into = std::max(one_way(partner, true, large, rounds) - alpha, 0.0) / static_cast<double>(large);
      } else if (partner == 0) {
        one_way(0, false, large, rounds);
      }
    };
    latency(inside, c[0]);
    latency(across, c[2]);
    bandwidth(inside, c[0], c[1]);
    bandwidth(across, c[2], c[3]);
    if (me == 0) c[4] = reduce_seconds(large, rounds) / static_cast<double>(large);
    flat_.broadcast(std::span<double>(c), 0);  // rank 0's
    set_costs({c[0], c[1], c[2], c[3], c[4], 0});
    std::array<double, 1> call{
        std::max(small_allreduce_seconds(20 * rounds) - model().flat(algorithm::recursive_doubling, 4), 0.0)};
    flat_.broadcast(std::span<double>(call), 0);
    set_costs({c[0], c[1], c[2], c[3], c[4], call[0]});
    if (hosts_.hosts > 1) {
      flat_.algorithms().model().alpha = c[2];
      flat_.algorithms().model().beta = c[3];
    }
    return costs_;
  }

  /// Every rank's `buf` gets the reduction of every rank's `buf`, identical on all ranks.
  template <element T>
  void allreduce(std::span<T> buf, reduce_op op) {
    const plan how = plan_for(buf.size_bytes());
    if (!how.two_levels) {
      flat_.allreduce(buf, op, how.flat);
      return;
    }
    const reduce_op level_op = op == reduce_op::avg ? reduce_op::sum : op;  // divide once, at the end
    if (hosts_.uniform) {
      // Blocks of equal size for the reduce-scatter; the few elements past them go flat.
      const auto l = static_cast<std::size_t>(hosts_.local_size);
      const std::size_t blocked = buf.size() / l * l;
      if (blocked > 0) pipelined_levels(buf.first(blocked), level_op, how.across);
      if (blocked < buf.size()) flat_.allreduce(buf.subspan(blocked), level_op);
    } else {
      local_.reduce(buf, level_op, 0);
      if (hosts_.local_rank == 0) cross_.allreduce(buf, level_op);
      local_.broadcast(buf, 0);
    }
    if (op == reduce_op::avg) reduce_.finish_average(buf, size());
  }

  /// Out of place.
  template <element T>
  void allreduce(std::type_identity_t<std::span<const T>> in, std::span<T> out, reduce_op op) {
    std::copy(in.begin(), in.end(), out.begin());
    allreduce(out, op);
  }

 private:
  // The three levels over chunks of `data` (each a multiple of the local size), pipelined: this
  // thread reduce-scatters chunk c + 1 and allgathers chunk c - 1 inside the host while a helper
  // thread reduces chunk c across hosts, so the fast links inside a host work while the slow one
  // between hosts does. Every rank runs the same sequence on each communicator: RS(0), RS(1),
  // AG(0), RS(2), AG(1), ... here, AR(0), AR(1), ... on the helper; AR(c) waits only for RS(c),
  // and AG(c) for AR(c), so no rank waits on a call a peer has not reached.
  template <element T>
  void pipelined_levels(std::span<T> data, reduce_op op, algorithm across_hosts) {
    const auto l = static_cast<std::size_t>(hosts_.local_size);
    const std::size_t per_chunk = std::max(l, pipeline_bytes_ / sizeof(T) / l * l);
    const std::size_t chunks = (data.size() + per_chunk - 1) / per_chunk;
    auto chunk = [&](std::size_t c) {
      return data.subspan(c * per_chunk, std::min(per_chunk, data.size() - c * per_chunk));
    };
    auto mine = [&](std::span<T> ch) {
      const std::size_t block = ch.size() / l;
      return ch.subspan(static_cast<std::size_t>(hosts_.local_rank) * block, block);
    };
    if (chunks == 1) {
      local_.reduce_scatter(data, op);
      cross_.allreduce(mine(data), op, across_hosts);
      local_.allgather(data);
      return;
    }
    std::mutex m;
    std::condition_variable cv;
    std::size_t scattered = 0, reduced = 0;  // chunks through each level so far
    bool failed = false;
    std::exception_ptr helper_error;
    auto wait_for = [&](const std::size_t& count, std::size_t c) {
      std::unique_lock lock(m);
      cv.wait(lock, [&] { return count > c || failed; });
      return !failed;
    };
    auto advance = [&](std::size_t& count) {
      std::lock_guard lock(m);
      ++count;
      cv.notify_all();
    };
    auto fail = [&] {
      std::lock_guard lock(m);
      failed = true;
      cv.notify_all();
    };
    std::thread across([&] {
      try {
        for (std::size_t c = 0; c < chunks && wait_for(scattered, c); ++c) {
          cross_.allreduce(mine(chunk(c)), op, across_hosts);
          advance(reduced);
        }
      } catch (...) {
        helper_error = std::current_exception();
        fail();
      }
    });
    try {
      for (std::size_t c = 0; c <= chunks; ++c) {
        if (c < chunks) {
          local_.reduce_scatter(chunk(c), op);
          advance(scattered);
        }
        if (c >= 1) {
          if (!wait_for(reduced, c - 1)) break;
          local_.allgather(chunk(c - 1));
        }
      }
    } catch (...) {
      fail();
      across.join();
      throw;
    }
    across.join();
    if (helper_error) std::rethrow_exception(helper_error);
  }

  plan choose(std::size_t bytes) const {
    const auto n = static_cast<double>(bytes);
    plan p;
    if (when_ == hierarchy::always) p.two_levels = true;
    if (when_ == hierarchy::never || !hosts_.uniform) return p;  // flat: the communicator's rules
    for (const auto& rule : flat_.options().algorithms.rules()) {
      if (rule.applies(coll_op::allreduce, bytes, size())) return p;  // a user's rule comes first
    }
    const cluster_model m = model();
    p.flat = m.best_flat(n);
    if (m.shape().hosts > 1 && m.shape().local > 1) {
      p.across = m.across_algorithm(n);
      if (when_ == hierarchy::automatic) p.two_levels = m.two_levels(n) < m.flat(p.flat, n);
    }
    return p;
  }

  // Seconds per call of `once`: the mean of `rounds` calls, after one to warm up.
  template <class Once>
  static double mean_seconds(int rounds, Once once) {
    once();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < rounds; ++i) once();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / rounds;
  }

  // Seconds per flat recursive-doubling allreduce of one float.
  double small_allreduce_seconds(int rounds) {
    std::array<float, 1> one{1.0f};
    return mean_seconds(rounds, [&] {
      flat_.allreduce(std::span<float>(one), reduce_op::sum, algorithm::recursive_doubling);
    });
  }

  // Seconds for this rank to reduce `bytes` of floats into others.
  double reduce_seconds(std::size_t bytes, int rounds) const {
    std::vector<float> into(bytes / sizeof(float), 1.0f), from(into.size(), 2.0f);
    return mean_seconds(rounds, [&] { reduce_(std::span<float>(into), std::span<const float>(from), reduce_op::sum); });
  }

  // The group rank of local rank `local` on host `host`, or -1 if there is none.
  int rank_at(int host, int local) const noexcept {
    for (std::size_t r = 0; r < hosts_.host_of.size(); ++r) {
      if (hosts_.host_of[r] == host && hosts_.local_of[r] == local) return static_cast<int>(r);
    }
    return -1;
  }

  // Seconds for `bytes` to go one way to `peer`: half the mean round trip; `first` sends first.
  double one_way(int peer, bool first, std::size_t bytes, int rounds) {
    std::vector<std::byte> buffer(bytes);
    auto& t = flat_.transport();
    const deadline d = deadline::after(flat_.options().timeout);
    auto hop = [&](bool send) {
      if (send) {
        t.isend(peer, calibrate_tag, signature{}, std::span<const std::byte>(buffer)).wait(d);
      } else {
        t.irecv(peer, calibrate_tag, std::span<std::byte>(buffer)).wait(d);
      }
    };
    return mean_seconds(rounds, [&] {
             hop(first);
             hop(!first);
           }) / 2;
  }

  // Seconds per exchange of `bytes` with `peer` (both send, both receive, as in a collective's
  // step).
  double exchange(int peer, std::size_t bytes, int rounds) {
    std::vector<std::byte> out(bytes), in(bytes);
    auto& t = flat_.transport();
    const deadline d = deadline::after(flat_.options().timeout);
    return mean_seconds(rounds, [&] {
      auto r = t.irecv(peer, calibrate_tag, std::span<std::byte>(in));
      t.isend(peer, calibrate_tag, signature{}, std::span<const std::byte>(out)).wait(d);
      r.wait(d);
    });
  }

  // The tag of calibrate's ping-pongs, beside the communicators' own: "calib".
  static constexpr std::uint64_t calibrate_tag = 0x63616c6962000000;

  host_map<World> hosts_;
  flat_type flat_, local_, cross_;
  hierarchy when_;
  two_level_costs costs_;
  Reduction reduce_{};
  std::size_t pipeline_bytes_ = std::size_t{4} << 20;
  std::vector<std::pair<std::size_t, plan>> plans_;  // by allreduce size
};

}  // namespace dtrain
