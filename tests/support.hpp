#pragma once
// Helpers shared by the tests: run one function per rank on threads of an in-process group.

#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "dtrain/transport/inproc.hpp"

namespace dtrain::test {

/// Runs `body(rank, endpoint)` on `p` threads, one per rank; rethrows the first exception.
inline void run_ranks(int p, const std::function<void(int, inproc_transport)>& body) {
  auto ranks = make_inproc_group(p);
  std::exception_ptr first;
  std::mutex m;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) {
    threads.emplace_back([&, r, t = std::move(ranks[static_cast<std::size_t>(r)])]() mutable {
      try {
        body(r, std::move(t));
      } catch (...) {
        std::lock_guard lock(m);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace dtrain::test
