// Every collective and algorithm over the in-process transport, in nccl-tests' columns:
//   size count type redop root | time algbw busbw #wrong
// Ranks are threads; each point runs warm-up calls, then timed calls, and reports the slowest
// rank's mean time per call. #wrong counts result elements that differ from the closed form.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "dtrain/collective/communicator.hpp"
#include "dtrain/transport/inproc.hpp"
#include "report.hpp"

using namespace dtrain;

namespace {

struct options {
  int ranks = 4;
  std::size_t min_bytes = 1024;
  std::size_t max_bytes = std::size_t{64} << 20;
  int step = 4;
  double seconds = 0.3;
  std::vector<std::string> ops{"allreduce", "reduce_scatter", "allgather", "broadcast",
                               "reduce",    "gather",         "scatter",   "alltoall"};
  std::string json;
};

coll_op op_named(const std::string& s) {
  for (int i = 0; i <= static_cast<int>(coll_op::barrier); ++i) {
    if (coll_op_name(static_cast<coll_op>(i)) == s) return static_cast<coll_op>(i);
  }
  throw CLI::ValidationError("--ops", "unknown collective " + s);
}

// One timed call of `op` with float32 sum; returns the number of wrong elements of its result.
long run_once(communicator<inproc_transport>& c, coll_op op, std::vector<float>& in,
              std::vector<float>& out, std::size_t count, bool check) {
  const int p = c.size();
  const int r = c.rank();
  const auto P = static_cast<std::size_t>(p);
  long wrong = 0;
  auto expect_sum = [&](std::size_t i) { return static_cast<float>(p * (p + 1) / 2 * static_cast<int>(i % 7)); };
  auto own = [](int rank, std::size_t i) { return static_cast<float>((rank + 1) * static_cast<int>(i % 7)); };
  switch (op) {
    case coll_op::allreduce:
      c.allreduce<float>(std::span(in).first(count), std::span(out).first(count), reduce_op::sum);
      if (check) for (std::size_t i = 0; i < count; ++i) wrong += out[i] != expect_sum(i);
      break;
    case coll_op::reduce:
      c.reduce<float>(std::span(in).first(count), std::span(out).first(count), reduce_op::sum, 0);
      if (check && r == 0) for (std::size_t i = 0; i < count; ++i) wrong += out[i] != expect_sum(i);
      break;
    case coll_op::reduce_scatter:
      c.reduce_scatter<float>(std::span(in).first(count * P), std::span(out).first(count), reduce_op::sum);
      if (check) for (std::size_t i = 0; i < count; ++i) wrong += out[i] != expect_sum(static_cast<std::size_t>(r) * count + i);
      break;
    case coll_op::allgather:
      c.allgather<float>(std::span(in).first(count), std::span(out).first(count * P));
      if (check) for (std::size_t i = 0; i < count * P; ++i) wrong += out[i] != own(static_cast<int>(i / count), i % count);
      break;
    case coll_op::broadcast:
      if (r == 0) std::copy_n(in.begin(), count, out.begin());
      c.broadcast(std::span(out).first(count), 0);
      if (check) for (std::size_t i = 0; i < count; ++i) wrong += out[i] != own(0, i);
      break;
    case coll_op::gather:
      c.gather<float>(std::span(in).first(count), std::span(out).first(r == 0 ? count * P : 0), 0);
      if (check && r == 0) for (std::size_t i = 0; i < count * P; ++i) wrong += out[i] != own(static_cast<int>(i / count), i % count);
      break;
    case coll_op::scatter:
      c.scatter<float>(std::span(in).first(r == 0 ? count * P : 0), std::span(out).first(count), 0);
      if (check) for (std::size_t i = 0; i < count; ++i) wrong += out[i] != own(0, static_cast<std::size_t>(r) * count + i);
      break;
    case coll_op::alltoall:
      c.alltoall<float>(std::span(in).first(count * P), std::span(out).first(count * P));
      if (check) for (std::size_t i = 0; i < count * P; ++i) wrong += out[i] != own(static_cast<int>(i / count), static_cast<std::size_t>(r) * count + i % count);
      break;
    default: break;
  }
  return wrong;
}

bench::row measure(const options& o, coll_op op, algorithm algo, std::size_t bytes) {
  const int p = o.ranks;
  const auto P = static_cast<std::size_t>(p);
  // nccl-tests' size: the vector for allreduce/broadcast/reduce, all blocks for the rest.
  const bool blocks = op != coll_op::allreduce && op != coll_op::broadcast && op != coll_op::reduce;
  const std::size_t total = bytes / sizeof(float);
  const std::size_t count = blocks ? std::max<std::size_t>(1, total / P) : total;  // what the call takes
  const std::size_t elems = blocks ? count * P : count;
  std::vector<double> per_rank(P);
  std::atomic<long> wrong{0};
  run_inproc(p, [&](int r, inproc_transport t) {
    communicator_options co;
    co.algorithms.force(op, algo);
    communicator<inproc_transport> c(std::move(t), co);
    std::vector<float> in(elems), out(elems);
    // in[i] = (r + 1) * (i % 7) on every rank gives every op a closed-form result.
    for (std::size_t i = 0; i < elems; ++i) in[i] = static_cast<float>((r + 1) * static_cast<int>(i % 7));
    // Warm up, then agree on an iteration count that fills about o.seconds.
    auto t0 = std::chrono::steady_clock::now();
    run_once(c, op, in, out, count, false);
    run_once(c, op, in, out, count, false);
    double one = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 2;
    std::vector<double> guess{std::clamp(o.seconds / std::max(one, 1e-7), 3.0, 10000.0)};
    c.broadcast(std::span(guess), 0);
    const int iters = static_cast<int>(guess[0]);
    c.barrier();
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) run_once(c, op, in, out, count, false);
    per_rank[static_cast<std::size_t>(r)] =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
    wrong += run_once(c, op, in, out, count, true);
  });
  bench::row row;
  row.op = std::string(coll_op_name(op));
  row.algo = std::string(algorithm_name(algo));
  row.type = "float32";
  row.redop = takes_reduce_op(op) ? "sum" : "none";
  row.ranks = p;
  row.bytes = elems * sizeof(float);
  row.count = count;
  row.seconds = *std::max_element(per_rank.begin(), per_rank.end());
  row.algbw = static_cast<double>(row.bytes) / row.seconds / 1e9;
  row.busbw = row.algbw * bench::busbw_factor(op, p);
  row.wrong = wrong.load();
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{"dtrain collectives over the in-process transport (nccl-tests columns)"};
  app.add_option("-n,--ranks", o.ranks, "ranks (threads)")->check(CLI::Range(1, 64));
  app.add_option("-b,--min-bytes", o.min_bytes, "smallest size");
  app.add_option("-e,--max-bytes", o.max_bytes, "largest size");
  app.add_option("-f,--step-factor", o.step, "size multiplier between points")->check(CLI::Range(2, 1024));
  app.add_option("-t,--seconds", o.seconds, "timed seconds per point");
  app.add_option("--ops", o.ops, "collectives to run");
  app.add_option("--json", o.json, "write the results as JSON to this file");
  CLI11_PARSE(app, argc, argv);

  std::vector<bench::row> rows;
  fmt::print("# dtrain bench_collectives: {} ranks (threads), in-process transport, out of place\n", o.ranks);
  fmt::print("# {:>14} {:>12} {:>14} {:>8} {:>5} | {:>11} {:>9} {:>9} {:>7}  {}\n", "size(B)", "count",
             "type", "redop", "root", "time(us)", "algbw", "busbw", "#wrong", "op/algorithm");
  for (const auto& name : o.ops) {
    coll_op op = op_named(name);
    for (algorithm a : all_algorithms) {
      if (!supports(op, a)) continue;
      for (std::size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= static_cast<std::size_t>(o.step)) {
        bench::row r = measure(o, op, a, bytes);
        fmt::print("  {:>14} {:>12} {:>14} {:>8} {:>5} | {:>11.1f} {:>9.3f} {:>9.3f} {:>7}  {}/{}\n",
                   r.bytes, r.count, r.type, r.redop, is_rooted(op) ? "0" : "-", r.seconds * 1e6,
                   r.algbw, r.busbw, r.wrong, r.op, r.algo);
        std::fflush(stdout);
        rows.push_back(r);
      }
    }
  }
  bench::write_file(o.json, bench::json_of(rows));
  long wrong = 0;
  for (const auto& r : rows) wrong += r.wrong;
  fmt::print("# {} points, {} wrong elements\n", rows.size(), wrong);
  return wrong == 0 ? 0 : 1;
}
