// Host discovery and the two-level allreduce, in process, with ranks placed on emulated hosts
// by host id: local ranks and host groups against their closed form, and the hierarchical
// allreduce (forced on, uniform and unequal hosts, pipelined in many chunks or one) bit for bit
// against the serial reference for every type, op and count, in place and out of place, world
// sizes 1-9.

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "../catch.hpp"
#include "conformance_case.hpp"
#include "dtrain/collective/hierarchical.hpp"
#include "dtrain/transport/hosts.hpp"
#include "dtrain/transport/inproc.hpp"

using namespace dtrain;
using namespace dtrain::conformance;
using group = process_group<inproc_transport>;

namespace {

std::string host_of(int r, int per_host) { return "emulated-host-" + std::to_string(r / per_host); }

template <class T>
int check_allreduce(hierarchical_communicator<inproc_transport>& c, int p, std::size_t n, reduce_op rop, bool in_place) {
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

TEST_CASE("discover_hosts: local ranks, host groups and cross groups for hosts of 2 and 3 ranks", "[collective][hosts]") {
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

TEST_CASE("hierarchical allreduce equals the serial reduction, uniform and unequal hosts, P = 1-9", "[collective][hosts]") {
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
                     check_allreduce<float16>(c, p, n, rop, in_place) + check_allreduce<bfloat16>(c, p, n, rop, !in_place);
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

TEST_CASE("hierarchical allreduce: the cost model takes two levels when hosts are many ranks over a slow link",
          "[collective][hosts]") {
  two_level_costs m;
  // 2 hosts x 4 ranks over 1 Gbit/s: a flat ring's steps each wait for a cross-host message of
  // n/8 (14 of them: 1.75 n), two levels put 2 * 1/2 of n on each host's link (n), plus the steps
  // inside the hosts: about 0.6.
  CHECK(m.two_levels(64e6, 2, 4) < m.flat_ring(64e6, 2, 4) * 0.65);
  CHECK(m.two_levels(64e6, 2, 4) > m.flat_ring(64e6, 2, 4) * 0.5);
  // One host: nothing crosses; two levels only add steps.
  CHECK(m.two_levels(64e6, 1, 4) >= m.flat_ring(64e6, 1, 4) * 0.99);
}
