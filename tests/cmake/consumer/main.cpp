// A consumer of the installed / added dtrain: allreduce across three threads.
#include <dtrain/dtrain.hpp>

#include <cstdio>
#include <thread>
#include <vector>

int main() {
  auto ranks = dtrain::make_inproc_group(3);
  std::vector<std::thread> threads;
  std::vector<int> ok(3, 0);
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      dtrain::ring<dtrain::inproc_transport> comm(std::move(ranks[static_cast<std::size_t>(r)]));
      std::vector<double> v(10, r + 1.0);
      comm.allreduce(std::span(v), dtrain::reduce_op::sum);
      ok[static_cast<std::size_t>(r)] = v[9] == 6.0;
    });
  }
  for (auto& t : threads) t.join();
  std::puts(ok == std::vector<int>{1, 1, 1} ? "consumer: ok" : "consumer: WRONG");
  return ok == std::vector<int>{1, 1, 1} ? 0 : 1;
}
