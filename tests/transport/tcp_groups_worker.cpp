// One rank of the multi-process process-group test, started by dtrain-run or mpirun: every
// collective and algorithm on the groups of three splits and along every axis of a mesh, over
// real sockets, all groups of the world at once, against the serial reference; then the ranks
// of a row and the same ranks formed again reduce at once on two threads; and the two-level
// allreduce with the ranks placed two per emulated host.
//
// Exit status: 0 every rank correct, 1 some rank saw a wrong result (every rank's verdict is
// summed across the world, so every rank exits 1), 3 a dtrain::error (printed).

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "../collective/group_case.hpp"
#include "dtrain/collective/hierarchical.hpp"
#include "dtrain/topology/mesh.hpp"
#include "dtrain/transport/group.hpp"
#include "dtrain/transport/tcp.hpp"

using namespace dtrain;
using namespace dtrain::conformance;
using group = process_group<tcp_transport>;

namespace {

int check_splits(group& world, std::string& first) {
  const int r = world.rank();
  int wrong = 0;
  const std::pair<int, int> colorings[] = {{r % 2, 0}, {r / 3, -r}, {r % 3 == 1 ? no_group : 0, r % 2}};
  for (auto [color, order] : colorings) {
    std::optional<group> g = world.split(color, order);
    if (g) wrong += run_all_types_on(*g, first);
  }
  return wrong;
}

// A 2 x (P/2) mesh when P is even (1 x P otherwise): the groups along both axes.
int check_mesh(group& world, std::string& first) {
  const int p = world.size();
  const int rows = p % 2 == 0 ? 2 : 1;
  device_mesh<tcp_transport> mesh(world, {{"dp", rows}, {"tp", p / rows}});
  return run_all_types_on(mesh.group("dp"), first) + run_all_types_on(mesh.group("tp"), first);
}

// The same ranks as two groups, reducing at once on two threads: only the tag spaces keep their
// messages apart over the shared connections.
int check_concurrent(group& world) {
  const int r = world.rank();
  group row = *world.split(r / 2, r);
  group row_again = *world.form(row.members(), "the row, again");
  int wrong = 0, wrong_again = 0;
  auto reduce_many = [&](group& g, std::int64_t salt, int& bad) {
    communicator<group> c(g);
    for (int i = 0; i < 100; ++i) {
      std::vector<std::int64_t> v(1000 + i % 7, r * salt + i);
      c.allreduce(std::span(v), reduce_op::sum);
      std::int64_t want = 0;
      for (int w : g.members().ranks()) want += w * salt + i;
      for (std::int64_t x : v) bad += x != want;
    }
  };
  std::exception_ptr failed;  // the other thread's error, rethrown here after the join
  std::thread other([&] {
    try {
      reduce_many(row_again, 1000, wrong_again);
    } catch (...) {
      failed = std::current_exception();
    }
  });
  reduce_many(row, 7, wrong);
  other.join();
  if (failed) std::rethrow_exception(failed);
  return wrong + wrong_again;
}

// The two-level allreduce (forced on) with two ranks per emulated host, against the serial
// reference: every op, three types, in place, sizes around the host's block boundary.
int check_hierarchical(group& world) {
  const int r = world.rank(), p = world.size();
  // Under bench/emulated_cluster.sh the hosts are real namespaces named in DTRAIN_HOST_ID, and the
  // launcher's local rank must be the one discovered; elsewhere ranks pair up by rank.
  const bool emulated = std::getenv("DTRAIN_HOST_ID") != nullptr;
  const std::string host = emulated ? this_host_id() : "emulated-host-" + std::to_string(r / 2);
  hierarchical_communicator<tcp_transport> c(world, {}, host, hierarchy::always);
  c.set_pipeline_bytes(std::size_t{64} << 10);  // 1 MiB of floats goes through in 16 chunks
  int wrong = 0;
  if (const char* local = std::getenv("DTRAIN_LOCAL_RANK"); emulated && local != nullptr) {
    if (c.hosts().local_rank != std::atoi(local)) {
      std::fprintf(stderr, "WRONG: discovered local rank %d, the launcher says %s\n", c.hosts().local_rank, local);
      ++wrong;
    }
  }
  auto one = [&]<class T>(std::size_t n, reduce_op rop) {
    std::vector<T> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = make<T>(input_value(coll_op::allreduce, rop, r, i));
    c.allreduce(std::span(v), rop);
    for (std::size_t i = 0; i < n; ++i) wrong += !(v[i] == reference_reduce<T>(coll_op::allreduce, rop, p, i));
    ++cases_run;
  };
  for (std::size_t n : {std::size_t{1}, std::size_t{1001}, std::size_t{1} << 18}) {
    for (reduce_op rop : {reduce_op::sum, reduce_op::prod, reduce_op::min, reduce_op::max, reduce_op::avg}) {
      one.operator()<float>(n, rop);
      one.operator()<std::int64_t>(n, rop);
      one.operator()<bfloat16>(n, rop);
    }
  }
  return wrong;
}

}  // namespace

int main() {
  try {
    tcp_options o;
    o.timeout = std::chrono::seconds(120);
    group world(tcp_transport::from_environment(o));
    std::string first;
    cases_run = 0;
    int wrong = check_splits(world, first) + check_mesh(world, first) + check_concurrent(world);
    if (const int h = check_hierarchical(world); h > 0) {
      wrong += h;
      if (first.empty()) first = "the hierarchical allreduce";
    }
    if (wrong > 0) std::fprintf(stderr, "WRONG: %d results, first: %s\n", wrong, first.c_str());
    int wrong_ranks = wrong > 0 ? 1 : 0;
    communicator<group>(world).allreduce(std::span(&wrong_ranks, 1), reduce_op::sum);
    std::printf("groups: rank %d ran %ld cases, %s; %s\n", world.rank(), cases_run.load(),
                wrong > 0 ? "WRONG" : "correct", wrong_ranks == 0 ? "all ranks correct" : "WRONG RESULTS on some rank");
    return wrong_ranks == 0 && cases_run.load() > 0 ? 0 : 1;
  } catch (const dtrain::error& e) {
    std::printf("caught dtrain::error [%s]: %s\n", e.code().message().c_str(), e.what());
    return 3;
  }
}
