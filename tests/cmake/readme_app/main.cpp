// The program README's FetchContent block builds (tests/cmake/run_doc_consumer.cmake): one
// rank of a job started by dtrain-run, an allreduce over TCP checked against its closed form.
#include <dtrain/collective/communicator.hpp>
#include <dtrain/transport/tcp.hpp>

#include <cstdio>
#include <vector>

int main() {
  dtrain::ring<dtrain::tcp_transport> comm(dtrain::tcp_transport::from_environment());
  const int p = comm.size();
  std::vector<double> v(1000, comm.rank() + 1.0);
  comm.allreduce(std::span(v), dtrain::reduce_op::sum);
  const double want = p * (p + 1) / 2.0;
  bool ok = p == 2;
  for (double x : v) ok = ok && x == want;
  std::printf("app: rank %d of %d: %s\n", comm.rank(), p, ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
