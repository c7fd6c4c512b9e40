// The scale simulator: cluster_model's prediction of every allreduce algorithm (flat ring,
// halving-doubling, recursive doubling, binomial tree, double binary tree, and the two-level
// hierarchical allreduce) for P ranks on hosts of L ranks each, from alpha and beta per link class
// (inside a host, between hosts) and gamma. Give it the constants a real run calibrated: the
// "# simulate_scale:" line bench_collectives --transport tcp-hosts prints is its flags.
//
//   simulate_scale [constants] [-b 65536 -b 67108864] [--ranks 2,4,..,1024] [--per-host 1,2,4,8]
//       a table per size: rows P x L, the predicted busbw (GB/s) per algorithm and the fastest
//   simulate_scale [constants] --predict --hosts 2 --per-host 4 -b 4096 -e 67108864 -f 4
//       one shape, nccl-tests' columns per algorithm and size
// Both write every prediction as JSON with --json.

#include <cstddef>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "dtrain/collective/cluster_model.hpp"
#include "report.hpp"

using namespace dtrain;

namespace {

struct options {
  double alpha_local_us = 10, gbps_local = 4, alpha_cross_us = 50, gbps_cross = 0.125, gbps_reduce = 4, call_us = 0;
  double segment_bytes = 1 << 20, pipeline_bytes = 4 << 20;
  std::vector<int> ranks{2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
  std::vector<int> per_host{1, 2, 4, 8};
  std::vector<std::size_t> sizes;
  std::size_t min_bytes = 4096, max_bytes = std::size_t{64} << 20;
  int factor = 4;
  bool predict = false;
  int hosts = 2;
  std::string json;
};

two_level_costs costs_of(const options& o) {
  return {o.alpha_local_us * 1e-6, 1e-9 / o.gbps_local, o.alpha_cross_us * 1e-6, 1e-9 / o.gbps_cross,
          1e-9 / o.gbps_reduce, o.call_us * 1e-6};
}

struct prediction {
  std::string algo;
  int hosts, per_host;
  std::size_t bytes;
  double seconds;
  double busbw() const {
    const int p = hosts * per_host;
    return static_cast<double>(bytes) / seconds * 1e-9 * bench::busbw_factor(coll_op::allreduce, p);
  }
};

// Every algorithm's time for `bytes` on `shape`; the two-level one only where it applies.
std::vector<prediction> predict(const cluster_model& m, std::size_t bytes) {
  std::vector<prediction> out;
  const auto n = static_cast<double>(bytes);
  for (algorithm a : flat_allreduce_algorithms) {
    out.push_back({std::string(algorithm_name(a)), m.shape().hosts, m.shape().local, bytes, m.flat(a, n)});
  }
  if (const double t = m.two_levels(n); t < std::numeric_limits<double>::infinity()) {
    out.push_back({"hierarchical", m.shape().hosts, m.shape().local, bytes, t});
  }
  return out;
}

std::string json_of(const std::vector<prediction>& rows) {
  std::string out = "[\n";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const prediction& r = rows[i];
    out += fmt::format(
        "  {{\"op\": \"allreduce\", \"algorithm\": \"{}\", \"ranks\": {}, \"hosts\": {}, \"per_host\": {}, "
        "\"bytes\": {}, \"time_us\": {:.3f}, \"busbw_GBps\": {:.4f}}}{}\n",
        r.algo, r.hosts * r.per_host, r.hosts, r.per_host, r.bytes, r.seconds * 1e6, r.busbw(),
        i + 1 < rows.size() ? "," : "");
  }
  return out + "]\n";
}

void print_constants(const options& o) {
  fmt::print("# cluster_model: inside a host alpha {} us, {} GB/s; between hosts alpha {} us, {} GB/s per host link; "
             "reduction {} GB/s; {} us per call; segments {} B, hierarchical chunks {} B\n",
             o.alpha_local_us, o.gbps_local, o.alpha_cross_us, o.gbps_cross, o.gbps_reduce, o.call_us, o.segment_bytes,
             o.pipeline_bytes);
}

// One shape, nccl-tests' columns.
std::vector<prediction> run_predict(const options& o) {
  const cluster_model m(costs_of(o), {o.hosts, o.per_host.front()}, o.segment_bytes, o.pipeline_bytes);
  std::vector<prediction> all;
  fmt::print("# {} hosts x {} ranks, predicted\n", o.hosts, o.per_host.front());
  fmt::print("# {:>12} {:>12} {:>6} {:>6} {:>20} | {:>10} {:>8} {:>8}\n", "size", "count", "type", "redop", "algorithm",
             "time(us)", "algbw", "busbw");
  for (std::size_t bytes : o.sizes) {
    for (const prediction& r : predict(m, bytes)) {
      fmt::print("  {:>12} {:>12} {:>6} {:>6} {:>20} | {:>10.1f} {:>8.3f} {:>8.3f}\n", bytes, bytes / 4, "float", "sum",
                 r.algo, r.seconds * 1e6, static_cast<double>(bytes) / r.seconds * 1e-9, r.busbw());
      all.push_back(r);
    }
  }
  return all;
}

// Per size, a table over P and L.
std::vector<prediction> run_table(const options& o) {
  std::vector<prediction> all;
  for (std::size_t bytes : o.sizes) {
    fmt::print("\n# allreduce of {} bytes: predicted busbw (GB/s)\n", bytes);
    fmt::print("# {:>5} {:>5} {:>3} |", "P", "hosts", "L");
    const char* names[] = {"ring", "halving_dbl", "recursive_dbl", "binomial", "double_tree", "hierarchical"};
    for (const char* n : names) fmt::print(" {:>13}", n);
    fmt::print(" | fastest\n");
    for (int l : o.per_host) {
      for (int p : o.ranks) {
        if (p < l || p % l != 0) continue;
        const cluster_model m(costs_of(o), {p / l, l}, o.segment_bytes, o.pipeline_bytes);
        const auto rows = predict(m, bytes);
        fmt::print("  {:>5} {:>5} {:>3} |", p, p / l, l);
        const prediction* best = &rows.front();
        for (const prediction& r : rows) {
          fmt::print(" {:>13.4f}", r.busbw());
          if (r.seconds < best->seconds) best = &r;
        }
        if (rows.size() < 6) fmt::print(" {:>13}", "-");
        fmt::print(" | {}\n", best->algo);
        all.insert(all.end(), rows.begin(), rows.end());
      }
    }
  }
  return all;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{"dtrain's scale simulator: predicted allreduce time per algorithm on hosts of L ranks"};
  app.add_option("--alpha-local", o.alpha_local_us, "microseconds per message inside a host");
  app.add_option("--gbps-local", o.gbps_local, "GB/s of a link inside a host");
  app.add_option("--alpha-cross", o.alpha_cross_us, "microseconds per message between hosts");
  app.add_option("--gbps-cross", o.gbps_cross, "GB/s of a host's link to the others");
  app.add_option("--gbps-reduce", o.gbps_reduce, "GB/s of the reduction");
  app.add_option("--call", o.call_us, "microseconds per collective call beyond its messages");
  app.add_option("--segment-bytes", o.segment_bytes, "pipeline segment of the flat algorithms");
  app.add_option("--pipeline-bytes", o.pipeline_bytes, "chunk of the hierarchical allreduce");
  app.add_option("--ranks", o.ranks, "world sizes P for the table")->delimiter(',');
  app.add_option("--per-host", o.per_host, "ranks per host L (the table: several; --predict: the first)")
      ->delimiter(',');
  app.add_option("-b,--minbytes", o.min_bytes, "smallest size");
  app.add_option("-e,--maxbytes", o.max_bytes, "largest size");
  app.add_option("-f,--stepfactor", o.factor, "size multiplier")->check(CLI::PositiveNumber);
  app.add_flag("--predict", o.predict, "one shape (--hosts x the first --per-host) in nccl-tests' columns");
  app.add_option("--hosts", o.hosts, "hosts, with --predict")->check(CLI::PositiveNumber);
  app.add_option("--json", o.json, "write every prediction here");
  CLI11_PARSE(app, argc, argv);
  if (o.factor < 2) o.factor = 2;
  for (std::size_t b = o.min_bytes; b <= o.max_bytes; b *= static_cast<std::size_t>(o.factor)) o.sizes.push_back(b);
  print_constants(o);
  const auto rows = o.predict ? run_predict(o) : run_table(o);
  bench::write_file(o.json, json_of(rows));
  return 0;
}
