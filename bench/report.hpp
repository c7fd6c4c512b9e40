#pragma once
// Table and JSON output shared by the benchmarks, in nccl-tests' terms:
// algbw = bytes / time, busbw = algbw * factor(op, ranks).

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "dtrain/core/signature.hpp"

namespace dtrain::bench {

/// Seconds per call of `op`: `warmup` calls, then calls until `min_seconds` have passed (and at
/// least five).
template <class Op>
double time_per_call(Op op, double min_seconds, int warmup) {
  using clock = std::chrono::steady_clock;
  for (int i = 0; i < warmup; ++i) op();
  int iters = 0;
  const auto t0 = clock::now();
  double elapsed = 0;
  while (elapsed < min_seconds || iters < 5) {
    op();
    ++iters;
    elapsed = std::chrono::duration<double>(clock::now() - t0).count();
  }
  return elapsed / iters;
}

/// nccl-tests' bus-bandwidth factor: the fraction of the data each rank must move over its link.
inline double busbw_factor(coll_op op, int p) {
  double n = p;
  switch (op) {
    case coll_op::allreduce: return 2 * (n - 1) / n;
    case coll_op::reduce_scatter:
    case coll_op::allgather:
    case coll_op::alltoall:
    case coll_op::gather:
    case coll_op::scatter: return (n - 1) / n;
    default: return 1.0;
  }
}

struct row {
  std::string op, algo, type, redop;
  int ranks = 0;
  std::size_t bytes = 0, count = 0;
  double seconds = 0;  // per call, the slowest rank's mean
  double algbw = 0, busbw = 0;  // GB/s
  long wrong = 0;
};

inline std::string json_of(const std::vector<row>& rows) {
  std::string out = "[\n";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const row& r = rows[i];
    out += fmt::format(
        "  {{\"op\": \"{}\", \"algorithm\": \"{}\", \"type\": \"{}\", \"redop\": \"{}\", \"ranks\": {}, "
        "\"bytes\": {}, \"count\": {}, \"time_us\": {:.3f}, \"algbw_GBps\": {:.4f}, "
        "\"busbw_GBps\": {:.4f}, \"wrong\": {}}}{}\n",
        r.op, r.algo, r.type, r.redop, r.ranks, r.bytes, r.count, r.seconds * 1e6, r.algbw, r.busbw,
        r.wrong, i + 1 < rows.size() ? "," : "");
  }
  return out + "]\n";
}

inline void write_file(const std::string& path, const std::string& text) {
  if (path.empty()) return;
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    fmt::print(stderr, "cannot write {}\n", path);
    return;
  }
  std::fputs(text.c_str(), f);
  std::fclose(f);
}

}  // namespace dtrain::bench
