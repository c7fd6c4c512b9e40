// Host discovery and the two-level allreduce, in process, with ranks placed on emulated hosts
// by host id: local ranks and host groups against their closed form, and the hierarchical
// allreduce (forced on, uniform and unequal hosts, pipelined in many chunks or one) bit for bit
// against the serial reference for every type, op and count, in place and out of place, world
// sizes 1-9.

#include <atomic>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "../catch.hpp"
#include "float_case.hpp"
#include "conformance_case.hpp"
#include "dtrain/collective/hierarchical.hpp"
#include "dtrain/topology/hosts.hpp"
#include "dtrain/transport/inproc.hpp"

using namespace dtrain;
using namespace dtrain::conformance;
using group = process_group<inproc_transport>;

namespace {

std::string host_of(int r, int per_host) { return "emulated-host-" + std::to_string(r / per_host); }

template <class T>
int check_allreduce(hierarchical_communicator<inproc_transport>& c, int p, std::size_t n, reduce_op rop,
                    bool in_place) {
  const int r = c.rank();
  std::vector<T> in(n), out(n);
  for (std::size_t i = 0; i < n; ++i) in[i] = make<T>(input_value(coll_op::allreduce, rop, r, i));
  if (in_place) {
    c.allreduce(std::span(in), rop);
    out = in;
  } else {
    c.allreduce(std::span<const T>(in), std::span(out), rop);
  }
  int wrong = 0;
  for (std::size_t i = 0; i < n; ++i) wrong += !(out[i] == reference_reduce<T>(coll_op::allreduce, rop, p, i));
  return wrong;
}

}  // namespace

TEST_CASE("discover_hosts: local ranks, host groups and cross groups for hosts of 2 and 3 ranks",
          "[collective][hosts]") {
  for (int per_host : {2, 3}) {
    for (int p = 1; p <= 9; ++p) {
      std::vector<std::string> got(static_cast<std::size_t>(p));
      run_inproc(p, [&](int r, inproc_transport t) {
        group world(std::move(t));
        auto h = discover_hosts(world, host_of(r, per_host));
        got[static_cast<std::size_t>(r)] = std::to_string(h.host) + "/" + std::to_string(h.hosts) + " " +
                                           std::to_string(h.local_rank) + "/" + std::to_string(h.local_size) + " " +
                                           h.local.members().text() + " " + h.cross.members().text() +
                                           (h.uniform ? " uniform" : " unequal");
      });
      for (int r = 0; r < p; ++r) {
        const int hosts = (p + per_host - 1) / per_host, host = r / per_host, local = r % per_host;
        const int local_size = std::min(per_host, p - host * per_host);
        std::vector<int> on_host, cross;
        for (int q = host * per_host; q < host * per_host + local_size; ++q) on_host.push_back(q);
        for (int h = 0; h < hosts; ++h) {
          if (h * per_host + local < p) cross.push_back(h * per_host + local);
        }
        const std::string want = std::to_string(host) + "/" + std::to_string(hosts) + " " + std::to_string(local) +
                                 "/" + std::to_string(local_size) + " " + rank_list(on_host).text() + " " +
                                 rank_list(cross).text() + (p % per_host == 0 || hosts == 1 ? " uniform" : " unequal");
        INFO("p = " << p << ", " << per_host << " per host, rank " << r);
        CHECK(got[static_cast<std::size_t>(r)] == want);
      }
    }
  }
}

TEST_CASE("discover_hosts: every rank agrees whether each host has two cores per rank, from the cores "
          "its ranks report", "[collective][hosts]") {
  // 5 ranks on hosts of 2, 2 and 1 rank; `cores[r]` is what rank r reports.
  auto agreed = [](std::vector<unsigned> cores) {
    const int p = static_cast<int>(cores.size());
    std::vector<int> got(cores.size(), -1);
    run_inproc(p, [&](int r, inproc_transport t) {
      group world(std::move(t));
      got[static_cast<std::size_t>(r)] =
          discover_hosts(world, host_of(r, 2), cores[static_cast<std::size_t>(r)]).two_cores_per_rank;
    });
    for (int g : got) REQUIRE(g == got.front());  // the same verdict on every rank
    return got.front() == 1;
  };
  CHECK(agreed({4, 4, 4, 4, 2}));
  CHECK(agreed({64, 64, 64, 64, 64}));
  CHECK_FALSE(agreed({4, 4, 3, 3, 2}));  // the second host has 3 cores for 2 ranks
  CHECK_FALSE(agreed({4, 4, 4, 4, 1}));
  CHECK_FALSE(agreed({4, 2, 4, 4, 2}));  // a host counts the fewest cores any of its ranks reported
  CHECK_FALSE(agreed({4, 4, 4, 4, 0}));  // unknown is not enough

  // The same rule on the exchanged pairs: {host id, cores} per rank.
  const std::vector<std::int64_t> two_hosts{7, 8, 7, 8, 9, 2};
  CHECK(two_cores_per_rank(two_hosts));
  CHECK_FALSE(two_cores_per_rank(std::vector<std::int64_t>{7, 8, 7, 8, 7, 8, 7, 8, 7, 8}));  // 5 ranks, 8 cores
  CHECK_FALSE(two_cores_per_rank(std::vector<std::int64_t>{}));
}

TEST_CASE("hierarchical allreduce equals the serial reduction, uniform and unequal hosts, P = 1-9",
          "[collective][hosts]") {
  std::atomic<long> cases{0};
  for (int per_host : {2, 3}) {
    for (int p = 1; p <= 9; ++p) {
      std::atomic<int> wrong{0};
      run_inproc(p, [&](int r, inproc_transport t) {
        communicator_options o;
        o.segment_bytes = 512;
        hierarchical_communicator<inproc_transport> c(group(std::move(t)), o, host_of(r, per_host), hierarchy::always);
        c.set_pipeline_bytes(p % 2 == 0 ? 1024 : std::size_t{4} << 20);  // many chunks in flight, or one
        for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{100003}}) {
          for (reduce_op rop : {reduce_op::sum, reduce_op::prod, reduce_op::min, reduce_op::max, reduce_op::avg}) {
            const bool in_place = (n + static_cast<std::size_t>(rop)) % 2 == 0;
            wrong += check_allreduce<float>(c, p, n, rop, in_place) + check_allreduce<double>(c, p, n, rop, !in_place) +
                     check_allreduce<std::int32_t>(c, p, n, rop, in_place) +
                     check_allreduce<std::int64_t>(c, p, n, rop, !in_place) +
                     check_allreduce<float16>(c, p, n, rop, in_place) +
                     check_allreduce<bfloat16>(c, p, n, rop, !in_place);
            cases += 6;
          }
        }
      });
      INFO("p = " << p << ", " << per_host << " ranks per host");
      CHECK(wrong.load() == 0);
    }
  }
  CHECK(cases.load() > 1000);
}

TEST_CASE("hierarchical allreduce: the model's plan per size, the same on every rank, and exact on automatic",
          "[collective][hosts]") {
  // 2 hosts x 3 ranks with the default constants (1 Gbit/s between hosts): small messages go
  // flat by the model's fastest algorithm, large ones in two levels; the result is exact either way.
  const int p = 6, per_host = 3;
  const cluster_model m(two_level_costs{}, {2, 3});
  std::vector<std::string> plans(p);
  std::atomic<int> wrong{0};
  run_inproc(p, [&](int r, inproc_transport t) {
    hierarchical_communicator<inproc_transport> c(group(std::move(t)), {}, host_of(r, per_host));
    std::string seen;
    for (std::size_t n : {std::size_t{2}, std::size_t{1000}, std::size_t{1} << 20}) {
      const auto plan = c.plan_for(n * sizeof(float));
      seen += plan.two_levels ? "two levels across by " + std::string(algorithm_name(plan.across)) + "; "
                              : "flat " + std::string(algorithm_name(plan.flat)) + "; ";
      wrong += check_allreduce<float>(c, p, n, reduce_op::sum, true);
    }
    plans[static_cast<std::size_t>(r)] = seen;
  });
  CHECK(wrong.load() == 0);
  std::string want;
  for (double bytes : {8.0, 4000.0, 4194304.0}) {
    const algorithm best = m.best_flat(bytes);
    want += m.two_levels(bytes) < m.flat(best, bytes)
                ? "two levels across by " + std::string(algorithm_name(m.across_algorithm(bytes))) + "; "
                : "flat " + std::string(algorithm_name(best)) + "; ";
  }
  for (const auto& seen : plans) CHECK(seen == want);
  CHECK(m.two_levels(4 << 20) < m.flat(m.best_flat(4 << 20), 4 << 20));
}

TEST_CASE("hierarchical allreduce: a user's rule on the flat communicator comes before the model",
          "[collective][hosts]") {
  std::vector<algorithm> flat(4);
  std::vector<int> two_levels(4, -1);
  run_inproc(4, [&](int r, inproc_transport t) {
    communicator_options o;
    o.algorithms.force(coll_op::allreduce, algorithm::binomial_tree);
    hierarchical_communicator<inproc_transport> c(group(std::move(t)), o, host_of(r, 2));
    const auto plan = c.plan_for(64 << 20);
    two_levels[static_cast<std::size_t>(r)] = plan.two_levels;
    flat[static_cast<std::size_t>(r)] = plan.flat;
  });
  CHECK(two_levels == std::vector<int>(4, 0));
  for (algorithm a : flat) CHECK(a == algorithm::automatic);  // the table (and its rule) decides
}

TEST_CASE("hierarchical allreduce: calibrate() measures positive constants and every rank gets rank 0's",
          "[collective][hosts]") {
  std::vector<two_level_costs> got(4), kept(4);
  run_inproc(4, [&](int r, inproc_transport t) {
    hierarchical_communicator<inproc_transport> c(group(std::move(t)), {}, host_of(r, 2));
    got[static_cast<std::size_t>(r)] = c.calibrate(std::size_t{1} << 16, 2);
    kept[static_cast<std::size_t>(r)] = c.costs();
  });
  for (int r = 0; r < 4; ++r)
    CHECK(kept[static_cast<std::size_t>(r)].alpha_cross == got[static_cast<std::size_t>(r)].alpha_cross);
  for (const auto& k : got) {
    CHECK(k.alpha_local > 0);
    CHECK(k.alpha_cross > 0);
    CHECK(k.gamma > 0);
    CHECK(k.call >= 0);
    CHECK(std::isfinite(k.beta_local + k.beta_cross));
    // Rank 0's figures, broadcast: the same bits on every rank, so every rank plans alike.
    CHECK(k.alpha_local == got[0].alpha_local);
    CHECK(k.beta_local == got[0].beta_local);
    CHECK(k.alpha_cross == got[0].alpha_cross);
    CHECK(k.beta_cross == got[0].beta_cross);
    CHECK(k.gamma == got[0].gamma);
    CHECK(k.call == got[0].call);
  }
}

// As conformance.cpp's random floats, through both levels with every algorithm across hosts.
TEST_CASE("hierarchical allreduce: random floats within the summation bound, the same bits on every rank",
          "[collective][hosts]") {
  for (int per_host : {2, 3}) {
    for (int p = 2; p <= 9; ++p) {
      for (algorithm across : {algorithm::ring, algorithm::halving_doubling, algorithm::recursive_doubling,
                               algorithm::binomial_tree, algorithm::double_binary_tree}) {
        std::atomic<int> wrong{0};
        std::string first;
        std::mutex m;
        run_inproc(p, [&](int r, inproc_transport t) {
          communicator_options o;
          o.segment_bytes = 512;
          o.algorithms.force(coll_op::allreduce, across);  // across hosts (and the flat tail)
          hierarchical_communicator<inproc_transport> c(
              group(std::move(t)), o, "emulated-host-" + std::to_string(r / per_host), hierarchy::always);
          c.set_pipeline_bytes(p % 2 == 0 ? 1024 : std::size_t{4} << 20);
          std::string mine;
          int bad = 0;
          for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}}) {
            for (reduce_op rop : {reduce_op::sum, reduce_op::avg}) {
              const float_case::spec s{coll_op::allreduce, across, p, n, rop, 0, n % 2 == 0, false, n + 7};
              bad += float_case::run_rank<float>(s, r, c, c.flat(), mine) +
                     float_case::run_rank<double>(s, r, c, c.flat(), mine);
            }
          }
          wrong += bad;
          std::lock_guard lock(m);
          if (first.empty()) first = mine;
        });
        INFO(per_host << " per host: " << first);
        REQUIRE(wrong.load() == 0);
      }
    }
  }
}
