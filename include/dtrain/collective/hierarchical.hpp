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
/// Whether the two levels beat the flat algorithms is the cost models' call per size, from alpha
/// and beta per link class (inside a host, between hosts), which `calibrate()` measures;
/// `hierarchy::always` and `never` force it.

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

#include "dtrain/collective/communicator.hpp"
#include "dtrain/concepts/element.hpp"
#include "dtrain/concepts/reduction.hpp"
#include "dtrain/core/reduce_op.hpp"
#include "dtrain/transport/group.hpp"
#include "dtrain/transport/hosts.hpp"

namespace dtrain {

/// When `hierarchical_communicator::allreduce` takes two levels.
enum class hierarchy { automatic, always, never };

/// Hockney's alpha-beta model with a pair of constants per link class. The defaults suit TCP
/// between hosts and shared memory or loopback inside one; measure both for a real cluster.
struct two_level_costs {
  double alpha_local = 10e-6, beta_local = 1.0 / 4e9;   ///< seconds per message / per byte inside a host
  double alpha_cross = 50e-6, beta_cross = 1.0 / 1.25e8;  ///< between hosts (1 Gbit/s)
  double gamma = 1.0 / 4e9;                               ///< seconds per byte reduced

  /// Flat ring over `hosts` x `local` ranks: every step waits for its slowest (cross-host) link.
  double flat_ring(double bytes, int hosts, int local) const noexcept {
    const double p = static_cast<double>(hosts) * local;
    if (p <= 1) return 0;
    const bool crosses = hosts > 1;
    const double a = crosses ? alpha_cross : alpha_local, b = crosses ? beta_cross : beta_local;
    return 2 * (p - 1) * (a + bytes / p * b) + (p - 1) / p * bytes * gamma;
  }

  /// Reduce-scatter and allgather rings inside a host, a ring allreduce of n/L across hosts. The
  /// L cross-host rings run at once and share each host's link: it carries L times one ring's
  /// bytes, 2(H-1)/H of n in all.
  double two_levels(double bytes, int hosts, int local) const noexcept {
    const double h = hosts, l = local;
    const double inside = l > 1 ? 2 * (l - 1) * (alpha_local + bytes / l * beta_local) + (l - 1) / l * bytes * gamma : 0;
    const double across = h > 1 ? 2 * (h - 1) * (alpha_cross + bytes / h * beta_cross) + (h - 1) / h * bytes / l * gamma : 0;
    return inside + across;
  }
};

template <transport World, reduction Reduction = host_reduction>
class hierarchical_communicator {
 public:
  using group = process_group<World>;
  using flat_type = communicator<group, Reduction>;

  /// Collective over `world`: learns which ranks share a host (`discover_hosts`; pass
  /// `host_id` to place ranks on emulated hosts) and builds the three communicators.
  explicit hierarchical_communicator(group world, communicator_options o = {}, std::string_view host_id = this_host_id(),
                                     hierarchy when = hierarchy::automatic, two_level_costs costs = {})
      : hosts_(discover_hosts(world, host_id)),
        flat_(world, o),
        local_(hosts_.local, o),
        cross_(hosts_.cross, o),
        when_(when),
        costs_(costs) {}

  int rank() const noexcept { return flat_.rank(); }
  int size() const noexcept { return flat_.size(); }
  const host_map<World>& hosts() const noexcept { return hosts_; }
  /// The whole group, flat: every collective but the two-level allreduce.
  flat_type& flat() noexcept { return flat_; }
  two_level_costs& costs() noexcept { return costs_; }
  /// Forces two levels or flat, or gives the choice back to the cost model (on every rank alike).
  void set_hierarchy(hierarchy when) noexcept { when_ = when; }
  /// The chunk of the two-level pipeline (4 MiB): smaller overlaps sooner, larger sends fewer
  /// messages. The same on every rank.
  void set_pipeline_bytes(std::size_t bytes) noexcept { pipeline_bytes_ = std::max<std::size_t>(bytes, 1); }

  /// Whether an allreduce of `bytes` takes two levels (the same answer on every rank): when the
  /// two-level estimate beats the flat communicator's best algorithm, estimated with the
  /// cross-host constants (a flat step waits for its slowest link).
  bool two_levels(std::size_t bytes) const noexcept {
    if (when_ != hierarchy::automatic) return when_ == hierarchy::always;
    if (!hosts_.uniform || hosts_.hosts < 2 || hosts_.local_size < 2) return false;
    const auto n = static_cast<double>(bytes);
    return costs_.two_levels(n, hosts_.hosts, hosts_.local_size) < flat_estimate(n);
  }

  /// The flat communicator's best allreduce estimate for `bytes`, in seconds.
  double flat_estimate(double bytes) const noexcept {
    const cost_model& m = flat_.options().algorithms.model();
    double best = std::numeric_limits<double>::infinity();
    for (algorithm a : all_algorithms) best = std::min(best, m.estimate(coll_op::allreduce, a, bytes, size()));
    return best;
  }

  /// Measures alpha and beta inside a host and between hosts: `rounds` ping-pongs of 8 bytes
  /// and of `large` bytes between rank 0 and another rank of its host, then between rank 0 and
  /// the first rank of the second host. The constants (rank 0's, broadcast) go into `costs()`,
  /// and the cross-host ones into the flat communicator's cost model, so both sides of the choice
  /// are estimated from this network. Collective. @returns the constants
  two_level_costs calibrate(std::size_t large = std::size_t{1} << 22, int rounds = 5) {
    std::array<double, 4> c{costs_.alpha_local, costs_.beta_local, costs_.alpha_cross, costs_.beta_cross};
    const int partner_inside = rank_at(0, 1), first_of_host1 = rank_at(1, 0);
    auto measure = [&](int other, double& alpha, double& beta) {
      if (other < 0) return;
      const double small = one_way(other, 8, rounds), big = one_way(other, large, rounds);
      if (flat_.rank() == 0) {
        alpha = small;
        beta = std::max(big - small, 0.0) / static_cast<double>(large);
      }
    };
    measure(partner_inside, c[0], c[1]);
    measure(first_of_host1, c[2], c[3]);
    flat_.broadcast(std::span<double>(c), 0);
    costs_.alpha_local = c[0];
    costs_.beta_local = c[1];
    costs_.alpha_cross = c[2];
    costs_.beta_cross = c[3];
    if (hosts_.hosts > 1) {
      flat_.algorithms().model().alpha = c[2];
      flat_.algorithms().model().beta = c[3];
    }
    return costs_;
  }

  /// Every rank's `buf` gets the reduction of every rank's `buf`, identical on all ranks.
  template <element T>
  void allreduce(std::span<T> buf, reduce_op op) {
    if (!two_levels(buf.size_bytes())) {
      flat_.allreduce(buf, op);
      return;
    }
    const reduce_op level_op = op == reduce_op::avg ? reduce_op::sum : op;  // divide once, at the end
    if (hosts_.uniform) {
      // Blocks of equal size for the reduce-scatter; the few elements past them go flat.
      const auto l = static_cast<std::size_t>(hosts_.local_size);
      const std::size_t blocked = buf.size() / l * l;
      if (blocked > 0) pipelined_levels(buf.first(blocked), level_op);
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
  void pipelined_levels(std::span<T> data, reduce_op op) {
    const auto l = static_cast<std::size_t>(hosts_.local_size);
    const std::size_t per_chunk = std::max(l, pipeline_bytes_ / sizeof(T) / l * l);
    const std::size_t chunks = (data.size() + per_chunk - 1) / per_chunk;
    auto chunk = [&](std::size_t c) { return data.subspan(c * per_chunk, std::min(per_chunk, data.size() - c * per_chunk)); };
    auto mine = [&](std::span<T> ch) {
      const std::size_t block = ch.size() / l;
      return ch.subspan(static_cast<std::size_t>(hosts_.local_rank) * block, block);
    };
    if (chunks == 1) {
      local_.reduce_scatter(data, op);
      cross_.allreduce(mine(data), op);
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
          cross_.allreduce(mine(chunk(c)), op);
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

  // The group rank of local rank `local` on host `host`, or -1 if there is none.
  int rank_at(int host, int local) const noexcept {
    for (std::size_t r = 0; r < hosts_.host_of.size(); ++r) {
      if (hosts_.host_of[r] == host && hosts_.local_of[r] == local) return static_cast<int>(r);
    }
    return -1;
  }

  // Seconds for `bytes` to go one way between group rank 0 and `other`: the mean of `rounds`
  // round trips (after one to warm up), halved. Only those two ranks take part; others return 0.
  double one_way(int other, std::size_t bytes, int rounds) {
    const int me = flat_.rank();
    if (me != 0 && me != other) return 0;
    const int peer = me == 0 ? other : 0;
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
    auto round_trip = [&] {
      hop(me == 0);
      hop(me != 0);
    };
    round_trip();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < rounds; ++i) round_trip();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / rounds / 2;
  }

  // The tag of calibrate's ping-pongs, beside the communicators' own: "calib".
  static constexpr std::uint64_t calibrate_tag = 0x63616c6962000000;

  host_map<World> hosts_;
  flat_type flat_, local_, cross_;
  hierarchy when_;
  two_level_costs costs_;
  Reduction reduce_{};
  std::size_t pipeline_bytes_ = std::size_t{4} << 20;
};

}  // namespace dtrain
