#pragma once
// Every collective and algorithm on one process group (this rank's; every group of the world
// runs the same at once), shared by the in-process group suite and the TCP group workers.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "conformance_case.hpp"
#include "dtrain/collective/communicator.hpp"

namespace dtrain::conformance {

inline std::atomic<long> cases_run{0};  // (rank, case) pairs, so a matrix that runs nothing fails

// Runs every collective with every algorithm that implements it on `g` (this rank's group; all
// groups of the world do the same at once), for a few counts; @returns how many results were
// wrong, with the first described in `first`.
template <class T, class Group>
int run_all_on(Group& g, std::string& first) {
  int wrong = 0;
  const int p = g.size();
  for (coll_op op : {coll_op::broadcast, coll_op::reduce, coll_op::allreduce, coll_op::reduce_scatter,
                     coll_op::allgather, coll_op::gather, coll_op::scatter, coll_op::alltoall}) {
    for (algorithm a : all_algorithms) {
      if (!supports(op, a)) continue;
      for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}}) {
        const reduce_op rop = n == 7 ? reduce_op::max : reduce_op::sum;
        const spec s{op, a, p, n, rop, is_rooted(op) ? p - 1 : 0, n == 1000 && op != coll_op::broadcast &&
                                                                     op != coll_op::gather && op != coll_op::scatter};
        const std::vector<T> expect = expected_results<T>(s);
        communicator_options o;
        o.algorithms.force(op, a);
        o.timeout = std::chrono::seconds(60);
        o.segment_bytes = 256;  // several segments at n = 1000
        communicator<Group> c(g, o);
        ++cases_run;
        run_rank<T>(
            s, g.rank(), c, expect, [&](int, std::span<const T> got, const std::function<T(std::size_t)>& want) {
              for (std::size_t i = 0; i < got.size(); ++i) {
                if (got[i] == want(i)) continue;
                if (wrong++ == 0)
                  first = describe_case(s, dtype_of_v<T>) + " on " + g.name() + ", element " + std::to_string(i);
                return;
              }
            });
      }
    }
  }
  return wrong;
}

template <class Group>
int run_all_types_on(Group& g, std::string& first) {
  return run_all_on<float>(g, first) + run_all_on<std::int32_t>(g, first) + run_all_on<bfloat16>(g, first);
}

}  // namespace dtrain::conformance
