#pragma once
// What the process-transport tests share when they run each rank of a group as a thread of this
// process (TCP, shared memory, mixed): the group formed through a TCP store served here, the
// first failure of any rank rethrown, and a sweep of every collective against the serial
// reference.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <initializer_list>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "../collective/conformance_case.hpp"
#include "dtrain/rendezvous/tcp_store.hpp"

namespace dtrain::testing {

// Runs body(rank, transport) on `n` threads; `connect(store, rank)` forms each rank's transport
// through its own client of one store. Rethrows the first failure.
template <class Connect, class Body>
void run_thread_ranks(int n, const std::string& token, Connect connect, Body body) {
  tcp_store_server server("127.0.0.1", 0, token);
  std::exception_ptr first;
  std::mutex m;
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) {
    ts.emplace_back([&, r] {
      try {
        tcp_store store("127.0.0.1", server.port(), deadline::after(std::chrono::seconds(10)), token);
        auto t = connect(store, r);
        body(r, t);
      } catch (...) {
        std::lock_guard lock(m);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& t : ts) t.join();
  if (first) std::rethrow_exception(first);
}

// A thread running `body`, the text of a dtrain::error it throws kept in `error` (for tests that
// check what each rank was told).
template <class Body>
std::thread thread_keeping_error(std::string& error, Body body) {
  return std::thread([&error, body = std::move(body)]() mutable {
    try {
      body();
    } catch (const dtrain::error& e) {
      error = e.what();
    }
  });
}

inline std::span<std::byte> bytes_of(std::vector<int>& v) { return std::as_writable_bytes(std::span(v)); }

inline signature sig_for(std::uint64_t count) {
  signature s;
  s.count = count;
  return s;
}

// Every collective with every algorithm that supports it, float sums of each count, on rank `r`
// of `c`'s `p` ranks; each result unequal to the serial reference's adds one to `wrong`.
template <class Comm>
void sweep_collectives(Comm& c, int p, int r, std::initializer_list<std::size_t> counts, std::atomic<int>& wrong) {
  using namespace conformance;
  for (coll_op op : {coll_op::broadcast, coll_op::reduce, coll_op::allreduce, coll_op::reduce_scatter,
                     coll_op::allgather, coll_op::gather, coll_op::scatter, coll_op::alltoall}) {
    for (algorithm a : all_algorithms) {
      if (!supports(op, a)) continue;
      for (std::size_t n : counts) {
        spec s{op, a, p, n, reduce_op::sum, is_rooted(op) ? p - 1 : 0, false};
        const auto expect = expected_results<float>(s);
        c.algorithms() = selection_table{};
        c.algorithms().force(op, a);
        run_rank<float>(s, r, c, expect,
                        [&](int, std::span<const float> got, const std::function<float(std::size_t)>& want) {
                          for (std::size_t i = 0; i < got.size(); ++i) {
                            if (!(got[i] == want(i))) {
                              ++wrong;
                              return;
                            }
                          }
                        });
      }
    }
  }
}

}  // namespace dtrain::testing
