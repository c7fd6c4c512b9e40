// One-way latency of the TCP transport: ranks 0 and 1 bounce a message back and forth; half the
// round trip, averaged, per size and progress policy. Run under dtrain-run with 2 ranks:
//   dtrain-run -n 2 build/bench/bench_tcp_latency [-b 64 -e 65536 -f 8 -i 2000] [--json out.json]
// Rank 1 sends back what it received, so rank 0's message must come home unchanged (#wrong
// counts the bytes that did not).

#include <chrono>
#include <cstdint>
#include <cstddef>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "dtrain/transport/tcp.hpp"
#include "report.hpp"

namespace {

struct options {
  std::size_t min_bytes = 64;
  std::size_t max_bytes = 65536;
  std::size_t step = 8;
  int iterations = 2000;
  std::string json;
};

struct point {
  std::size_t bytes;
  const char* policy;
  double one_way_us;
  long wrong;
};

// Mean one-way time in microseconds for `bytes`, after a warm-up of a tenth of the iterations;
// `wrong`: on rank 0, the bytes of its last message that did not come back as sent. Rank 0 sends
// from `sent`, stamped with the round trip's number, and receives into a buffer that started at
// zero, so an empty, stale or changed echo shows.
template <class Transport>
double one_way_us(Transport& t, std::size_t bytes, int iterations, long& wrong) {
  std::vector<std::byte> sent(bytes), buf(bytes);
  for (std::size_t i = 0; i < bytes; ++i) sent[i] = static_cast<std::byte>(i * 131 + 7);
  const int peer = 1 - t.rank();
  const auto d = dtrain::deadline::after(std::chrono::seconds(60));
  int trip = 0;
  auto bounce = [&](int n) {
    for (int i = 0; i < n; ++i) {
      if (t.rank() == 0) {
        ++trip;
        if (bytes > 0) sent[0] = static_cast<std::byte>(trip);
        if (bytes > 1) sent[1] = static_cast<std::byte>(trip >> 8);
        t.isend(peer, 1, {}, sent).wait(d);
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
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  if (t.rank() == 0) {
    for (std::size_t i = 0; i < bytes; ++i) wrong += buf[i] != sent[i];
  }
  return us / iterations / 2;
}

template <class Transport>
void run(const options& o, const char* policy, std::uint64_t epoch, std::vector<point>& points) {
  // Each group is formed anew through the same store, so each needs its own epoch.
  dtrain::tcp_options to;
  to.epoch = epoch;
  auto t = Transport::from_environment(to);
  if (t.size() != 2) throw dtrain::error(dtrain::errc::invalid_argument, "bench_tcp_latency needs exactly 2 ranks");
  if (epoch == 0 && t.rank() == 0) {
    fmt::print("# {:>10} {:>22} | {:>11} {:>7}\n", "size(B)", "progress", "one-way(us)", "#wrong");
  }
  for (std::size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= o.step) {
    long wrong = 0;
    const double us = one_way_us(t, bytes, o.iterations, wrong);
    if (t.rank() != 0) continue;
    fmt::print("  {:>10} {:>22} | {:>11.2f} {:>7}\n", bytes, policy, us, wrong);
    points.push_back({bytes, policy, us, wrong});
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
  app.add_option("--json", o.json, "write the results as JSON (rank 0)");
  CLI11_PARSE(app, argc, argv);
  std::vector<point> points;
  run<dtrain::tcp_transport>(o, "blocking", 0, points);
  run<dtrain::basic_tcp_transport<dtrain::spin_then_block<1000>>>(o, "spin_then_block<1000>", 1, points);
  long wrong = 0;
  std::string out = "[\n";
  for (std::size_t i = 0; i < points.size(); ++i) {
    const point& p = points[i];
    wrong += p.wrong;
    out += fmt::format("  {{\"bytes\": {}, \"progress\": \"{}\", \"one_way_us\": {:.3f}, \"wrong\": {}}}{}\n", p.bytes,
                       p.policy, p.one_way_us, p.wrong, i + 1 < points.size() ? "," : "");
  }
  if (!points.empty()) dtrain::bench::write_file(o.json, out + "]\n");  // rank 0's
  return wrong == 0 ? 0 : 1;
}
