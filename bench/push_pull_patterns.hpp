#pragma once
// What bench_tcp_ceiling and peers/zmq_push_pull share: bench_ps's three message patterns, their
// options, their counting (push+pull counts both directions, as bench_ps does) and their table and
// JSON. Standard library, CLI11 and fmt only, so the peer program needs nothing of dtrain.

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

namespace dtrain::bench {

/// push: N bytes out, an acknowledgement back; pull: a request header, N bytes back;
/// push+pull: N bytes each way.
enum class pattern : std::uint32_t { push = 1, pull = 2, push_pull = 3, done = 4 };

/// What a request starts with; a push or push+pull's `bytes` of values follow it.
struct request_header {
  pattern what;
  std::uint32_t pad;
  std::uint64_t bytes;
};

/// The size of a push's acknowledgement.
inline constexpr std::size_t ack_bytes = 8;

struct pattern_options {
  double seconds = 1.0;
  int depth = 1;
  std::vector<std::size_t> sizes{std::size_t{4} << 10, std::size_t{1} << 20, std::size_t{16} << 20};
  std::string json;

  void add_to(CLI::App& app) {
    app.add_option("--seconds", seconds, "time per measurement")->check(CLI::PositiveNumber);
    app.add_option("--depth", depth, "requests in flight")->check(CLI::Range(1, 1024));
    app.add_option("--sizes", sizes, "value bytes per request")
        ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 30));
    app.add_option("--json", json, "write the results as JSON");
  }
};

struct pattern_result {
  const char* what;
  std::size_t bytes;
  double seconds, gbps;
};

/// Times every pattern at every size: `time(pattern, bytes)` returns seconds per request.
template <class Time>
std::vector<pattern_result> run_patterns(const pattern_options& o, Time time) {
  std::vector<pattern_result> results;
  for (std::size_t bytes : o.sizes) {
    for (auto [what, name] :
         {std::pair{pattern::push, "push"}, {pattern::pull, "pull"}, {pattern::push_pull, "push+pull"}}) {
      const double s = time(what, bytes);
      const double moved = static_cast<double>(bytes) * (what == pattern::push_pull ? 2 : 1);
      results.push_back({name, bytes, s, moved / s / 1e9});
    }
  }
  return results;
}

/// Prints `title`, then one row per result named "<prefix> <pattern>"; writes JSON if asked.
inline void print_patterns(const std::string& prefix, const std::string& title, const pattern_options& o,
                           const std::vector<pattern_result>& results) {
  fmt::print("# {}, {} request(s) in flight\n", title, o.depth);
  fmt::print("# {:<18} {:>12} {:>12} {:>10}\n", "op", "size(B)", "time(us)", "GB/s");
  std::string out = "[\n";
  for (std::size_t i = 0; i < results.size(); ++i) {
    const pattern_result& r = results[i];
    fmt::print("  {:<18} {:>12} {:>12.1f} {:>10.3f}\n", prefix + " " + r.what, r.bytes, r.seconds * 1e6, r.gbps);
    out +=
        fmt::format("  {{\"op\": \"{} {}\", \"depth\": {}, \"bytes\": {}, \"time_us\": {:.2f}, \"GBps\": {:.4f}}}{}\n",
                    prefix, r.what, o.depth, r.bytes, r.seconds * 1e6, r.gbps, i + 1 < results.size() ? "," : "");
  }
  if (o.json.empty()) return;
  if (std::FILE* f = std::fopen(o.json.c_str(), "w")) {
    std::fputs((out + "]\n").c_str(), f);
    std::fclose(f);
  } else {
    fmt::print(stderr, "cannot write {}\n", o.json);
  }
}

}  // namespace dtrain::bench
