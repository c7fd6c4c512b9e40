// One-way latency of the TCP transport: ranks 0 and 1 bounce a message back and forth; half the
// round trip, averaged, per size and progress policy. Run under dtrain-run with 2 ranks:
//   dtrain-run -n 2 build/bench/bench_tcp_latency [-b 64 -e 65536 -f 8 -i 2000]

#include <chrono>
#include <cstdint>
#include <cstddef>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "dtrain/transport/tcp.hpp"

namespace {

struct options {
  std::size_t min_bytes = 64;
  std::size_t max_bytes = 65536;
  std::size_t step = 8;
  int iterations = 2000;
};

// Mean one-way time in microseconds for `bytes`, after a warm-up of a tenth of the iterations.
template <class Transport>
double one_way_us(Transport& t, std::size_t bytes, int iterations) {
  std::vector<std::byte> buf(bytes);
  const int peer = 1 - t.rank();
  const auto d = dtrain::deadline::after(std::chrono::seconds(60));
  auto bounce = [&](int n) {
    for (int i = 0; i < n; ++i) {
      if (t.rank() == 0) {
        t.isend(peer, 1, {}, buf).wait(d);
        t.irecv(peer, 1, std::span(buf)).wait(d);
      } else {
        t.irecv(peer, 1, std::span(buf)).wait(d);
        t.isend(peer, 1, {}, buf).wait(d);
      }
    }
  };
  bounce(iterations / 10 + 1);
  auto t0 = std::chrono::steady_clock::now();
  bounce(iterations);
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iterations / 2;
}

template <class Transport>
void run(const options& o, const char* policy, std::uint64_t epoch) {
  // Each group is formed anew through the same store, so each needs its own epoch.
  dtrain::tcp_options to;
  to.epoch = epoch;
  auto t = Transport::from_environment(to);
  if (t.size() != 2) throw dtrain::error(dtrain::errc::invalid_argument, "bench_tcp_latency needs exactly 2 ranks");
  if (epoch == 0 && t.rank() == 0) fmt::print("# {:>10} {:>22} | {:>11}\n", "size(B)", "progress", "one-way(us)");
  for (std::size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= o.step) {
    double us = one_way_us(t, bytes, o.iterations);
    if (t.rank() == 0) fmt::print("  {:>10} {:>22} | {:>11.2f}\n", bytes, policy, us);
  }
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{"one-way latency of the TCP transport (ping-pong between 2 ranks)"};
  app.add_option("-b,--min-bytes", o.min_bytes, "smallest message");
  app.add_option("-e,--max-bytes", o.max_bytes, "largest message");
  app.add_option("-f,--step-factor", o.step, "size multiplier")->check(CLI::Range(2, 1024));
  app.add_option("-i,--iterations", o.iterations, "round trips per point")->check(CLI::Range(1, 10000000));
  CLI11_PARSE(app, argc, argv);
  run<dtrain::tcp_transport>(o, "blocking", 0);
  run<dtrain::basic_tcp_transport<dtrain::spin_then_block<1000>>>(o, "spin_then_block<1000>", 1);
  return 0;
}
