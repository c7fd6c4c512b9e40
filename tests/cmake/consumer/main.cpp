// A consumer of the installed / added dtrain: allreduce across three threads.
#include <dtrain/dtrain.hpp>

#include <cstdio>
#include <vector>

int main() {
  std::vector<int> ok(3, 0);
  dtrain::run_inproc(3, [&](int r, dtrain::inproc_transport endpoint) {
    dtrain::ring<dtrain::inproc_transport> comm(std::move(endpoint));
    std::vector<double> v(10, r + 1.0);
    comm.allreduce(std::span(v), dtrain::reduce_op::sum);
    ok[static_cast<std::size_t>(r)] = v[9] == 6.0;
  });
  std::puts(ok == std::vector<int>{1, 1, 1} ? "consumer: ok" : "consumer: WRONG");
  return ok == std::vector<int>{1, 1, 1} ? 0 : 1;
}
