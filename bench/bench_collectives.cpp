// Every collective and algorithm, in nccl-tests' columns:
//   size count type redop root | time algbw busbw #wrong
// --transport inproc: ranks are threads of this process. --transport tcp: this process is one
// rank, started by dtrain-run or mpirun (tcp_transport::from_environment); rank 0 prints.
// --transport shm: the same over shared memory (every rank on this host).
// --transport tcp-hosts: the same, on hosts (real, or bench/emulated_cluster.sh's): the flat
// algorithms, then allreduce as "hierarchical" (two levels, forced) and "auto" (two levels or
// the flat choice, as cluster_model says from the calibrated constants), from one
// hierarchical_communicator.
// Each point runs warm-up calls, then timed calls, and reports the slowest rank's mean time per
// call. #wrong counts result elements that differ from the closed form.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "dtrain/collective/communicator.hpp"
#include "dtrain/collective/hierarchical.hpp"
#include "dtrain/transport/inproc.hpp"
#include "dtrain/transport/shm.hpp"
#include "dtrain/transport/tcp.hpp"
#include "report.hpp"

using namespace dtrain;

namespace {

// `--progress spin`: a rank with a core of its own waits awake for up to 1 ms past the last byte
// it saw move, so a peer's reduction between two messages does not put it to sleep (Open MPI
// and NCCL poll without a limit).
using spinning = spin_then_block<1000>;

// `run(std::type_identity<Transport<P>>)`, P the progress policy `--progress` names.
template <template <class> class Transport, class Run>
int with_progress(const std::string& progress, Run run) {
  if (progress == "spin") return run(std::type_identity<Transport<spinning>>{});
  if (progress == "blocking") return run(std::type_identity<Transport<blocking>>{});
  return run(std::type_identity<Transport<default_progress>>{});
}

struct options {
  int ranks = 4;
  std::size_t min_bytes = 1024;
  std::size_t max_bytes = std::size_t{64} << 20;
  int step = 4;
  double seconds = 0.3;
  std::vector<std::string> ops{"allreduce", "reduce_scatter", "allgather", "broadcast",
                               "reduce",    "gather",         "scatter",   "alltoall"};
  std::string json;
  std::string transport = "inproc";
  std::string progress = "default";
  std::vector<std::string> algorithms;
  std::size_t segment_bytes = communicator_options{}.segment_bytes;
};

coll_op op_named(const std::string& s) {
  for (int i = 0; i <= static_cast<int>(coll_op::barrier); ++i) {
    if (coll_op_name(static_cast<coll_op>(i)) == s) return static_cast<coll_op>(i);
  }
  throw CLI::ValidationError("--ops", "unknown collective " + s);
}

// bench's view of a hierarchical communicator: allreduce through it; every other collective
// runs on `flat_of(view)`, its whole group. Its own selection table takes time_point's resets,
// so the communicator keeps its calibrated one.
template <class H>
struct two_level_view {
  H& h;
  selection_table ignored{};
  int rank() const noexcept { return h.rank(); }
  int size() const noexcept { return h.size(); }
  selection_table& algorithms() { return ignored; }
  template <class T>
  void allreduce(std::type_identity_t<std::span<const T>> in, std::span<T> out, reduce_op op) {
    h.template allreduce<T>(in, out, op);
  }
};

// Where the collectives other than the timed allreduce run: the communicator itself, or a
// hierarchical one's flat group.
template <class Comm>
Comm& flat_of(Comm& c) { return c; }
template <class H>
auto& flat_of(two_level_view<H>& v) { return v.h.flat(); }

// One timed call of `op` with float32 sum; returns the number of wrong elements of its result.
template <class Comm>
long run_once(Comm& c, coll_op op, std::vector<float>& in,
              std::vector<float>& out, std::size_t count, bool check) {
  auto& f = flat_of(c);
  const int p = c.size();
  const int r = c.rank();
  const auto P = static_cast<std::size_t>(p);
  long wrong = 0;
  auto expect_sum = [&](std::size_t i) { return static_cast<float>(p * (p + 1) / 2 * static_cast<int>(i % 7)); };
  auto own = [](int rank, std::size_t i) { return static_cast<float>((rank + 1) * static_cast<int>(i % 7)); };
  switch (op) {
    case coll_op::allreduce:
      c.template allreduce<float>(std::span(in).first(count), std::span(out).first(count), reduce_op::sum);
      if (check) for (std::size_t i = 0; i < count; ++i) wrong += out[i] != expect_sum(i);
      break;
    case coll_op::reduce:
      f.template reduce<float>(std::span(in).first(count), std::span(out).first(count), reduce_op::sum, 0);
      if (check && r == 0) for (std::size_t i = 0; i < count; ++i) wrong += out[i] != expect_sum(i);
      break;
    case coll_op::reduce_scatter:
      f.template reduce_scatter<float>(std::span(in).first(count * P), std::span(out).first(count), reduce_op::sum);
      if (check)
        for (std::size_t i = 0; i < count; ++i) wrong += out[i] != expect_sum(static_cast<std::size_t>(r) * count + i);
      break;
    case coll_op::allgather:
      f.template allgather<float>(std::span(in).first(count), std::span(out).first(count * P));
      if (check)
        for (std::size_t i = 0; i < count * P; ++i) wrong += out[i] != own(static_cast<int>(i / count), i % count);
      break;
    case coll_op::broadcast:
      if (r == 0) std::copy_n(in.begin(), count, out.begin());
      f.broadcast(std::span(out).first(count), 0);
      if (check) for (std::size_t i = 0; i < count; ++i) wrong += out[i] != own(0, i);
      break;
    case coll_op::gather:
      f.template gather<float>(std::span(in).first(count), std::span(out).first(r == 0 ? count * P : 0), 0);
      if (check && r == 0)
        for (std::size_t i = 0; i < count * P; ++i) wrong += out[i] != own(static_cast<int>(i / count), i % count);
      break;
    case coll_op::scatter:
      f.template scatter<float>(std::span(in).first(r == 0 ? count * P : 0), std::span(out).first(count), 0);
      if (check)
        for (std::size_t i = 0; i < count; ++i) wrong += out[i] != own(0, static_cast<std::size_t>(r) * count + i);
      break;
    case coll_op::alltoall:
      f.template alltoall<float>(std::span(in).first(count * P), std::span(out).first(count * P));
      if (check)
        for (std::size_t i = 0; i < count * P; ++i)
          wrong += out[i] != own(static_cast<int>(i / count), static_cast<std::size_t>(r) * count + i % count);
      break;
    default: break;
  }
  return wrong;
}

// nccl-tests' size: the vector for allreduce/broadcast/reduce, all blocks for the rest.
struct shape {
  std::size_t count;  // what the call takes
  std::size_t elems;  // elements in the buffers
};
shape shape_of(coll_op op, std::size_t bytes, int p) {
  const auto P = static_cast<std::size_t>(p);
  const bool blocks = op != coll_op::allreduce && op != coll_op::broadcast && op != coll_op::reduce;
  const std::size_t total = bytes / sizeof(float);
  const std::size_t count = blocks ? std::max<std::size_t>(1, total / P) : total;
  return {count, blocks ? count * P : count};
}

// What one rank does for one point; returns its mean seconds per call and adds its wrong count.
template <class Comm>
double time_point(Comm& c, const options& o, coll_op op, algorithm algo, std::size_t bytes, long& wrong) {
  c.algorithms() = selection_table{};
  if (algo != algorithm::automatic) c.algorithms().force(op, algo);  // automatic: the cost model's pick
  const int r = c.rank();
  const shape sh = shape_of(op, bytes, c.size());
  std::vector<float> in(sh.elems), out(sh.elems);
  // in[i] = (r + 1) * (i % 7) on every rank gives every op a closed-form result.
  for (std::size_t i = 0; i < sh.elems; ++i) in[i] = static_cast<float>((r + 1) * static_cast<int>(i % 7));
  // Warm up, then agree on an iteration count that fills about o.seconds.
  auto t0 = std::chrono::steady_clock::now();
  run_once(c, op, in, out, sh.count, false);
  run_once(c, op, in, out, sh.count, false);
  double one = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 2;
  std::vector<double> guess{std::clamp(o.seconds / std::max(one, 1e-7), 3.0, 10000.0)};
  flat_of(c).broadcast(std::span(guess), 0);
  const int iters = static_cast<int>(guess[0]);
  flat_of(c).barrier();
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) run_once(c, op, in, out, sh.count, false);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
  wrong += run_once(c, op, in, out, sh.count, true);
  return seconds;
}

bench::row make_row(coll_op op, algorithm algo, int p, std::size_t bytes, double seconds, long wrong) {
  const shape sh = shape_of(op, bytes, p);
  bench::row row;
  row.op = std::string(coll_op_name(op));
  row.algo = std::string(algorithm_name(algo));
  row.type = "float32";
  row.redop = takes_reduce_op(op) ? "sum" : "none";
  row.ranks = p;
  row.bytes = sh.elems * sizeof(float);
  row.count = sh.count;
  row.seconds = seconds;
  row.algbw = static_cast<double>(row.bytes) / row.seconds / 1e9;
  row.busbw = row.algbw * bench::busbw_factor(op, p);
  row.wrong = wrong;
  return row;
}

// In-process: a fresh group of threads per point.
bench::row measure_inproc(const options& o, coll_op op, algorithm algo, std::size_t bytes) {
  std::vector<double> per_rank(static_cast<std::size_t>(o.ranks));
  std::atomic<long> wrong{0};
  run_inproc(o.ranks, [&](int r, inproc_transport t) {
    communicator_options co;
    co.segment_bytes = o.segment_bytes;
    communicator<inproc_transport> c(std::move(t), co);
    long w = 0;
    per_rank[static_cast<std::size_t>(r)] = time_point(c, o, op, algo, bytes, w);
    wrong += w;
  });
  return make_row(op, algo, o.ranks, bytes, *std::max_element(per_rank.begin(), per_rank.end()), wrong.load());
}

// TCP: this process's rank on one communicator for every point; the slowest rank's time.
template <class Comm>
bench::row measure_on(Comm& c, const options& o, coll_op op, algorithm algo, std::size_t bytes) {
  long w = 0;
  std::vector<double> seconds{time_point(c, o, op, algo, bytes, w)};
  std::vector<std::int64_t> wrong{w};
  flat_of(c).allreduce(std::span(seconds), reduce_op::max);
  flat_of(c).allreduce(std::span(wrong), reduce_op::sum);
  return make_row(op, algo, c.size(), bytes, seconds[0], static_cast<long>(wrong[0]));
}

// A row measured some other way than by a flat algorithm: its name and how to measure a size.
struct variant {
  std::string name;
  std::function<bench::row(std::size_t bytes)> measure;
};

template <class Measure>
int run_all(const options& o, int ranks, bool printer, const std::string& what, Measure measure,
            const std::vector<variant>& allreduce_variants = {}) {
  std::vector<bench::row> rows;
  auto print = [&](fmt::string_view format, const auto&... args) {
    if (printer) fmt::vprint(format, fmt::make_format_args(args...));
  };
  print("# dtrain bench_collectives: {} ranks, {}, out of place\n", ranks, what);
  print("# {:>14} {:>12} {:>14} {:>8} {:>5} | {:>11} {:>9} {:>9} {:>7}  {}\n", "size(B)", "count", "type",
        "redop", "root", "time(us)", "algbw", "busbw", "#wrong", "op/algorithm");
  auto add = [&](bench::row r, coll_op op) {
    print("  {:>14} {:>12} {:>14} {:>8} {:>5} | {:>11.1f} {:>9.3f} {:>9.3f} {:>7}  {}/{}\n", r.bytes, r.count, r.type,
          r.redop, is_rooted(op) ? "0" : "-", r.seconds * 1e6, r.algbw, r.busbw, r.wrong, r.op, r.algo);
    std::fflush(stdout);
    rows.push_back(std::move(r));
  };
  for (const auto& name : o.ops) {
    coll_op op = op_named(name);
    for (algorithm a : all_algorithms) {
      if (!supports(op, a) || (!o.algorithms.empty() && std::find(o.algorithms.begin(), o.algorithms.end(),
                                                                  algorithm_name(a)) == o.algorithms.end())) {
        continue;
      }
      for (std::size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= static_cast<std::size_t>(o.step)) {
        add(measure(op, a, bytes), op);
      }
    }
    if (op != coll_op::allreduce) continue;
    for (const variant& v : allreduce_variants) {
      for (std::size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= static_cast<std::size_t>(o.step)) {
        bench::row r = v.measure(bytes);
        if (r.algo == "automatic") r.algo = v.name;
        add(std::move(r), op);
      }
    }
  }
  if (printer) bench::write_file(o.json, bench::json_of(rows));
  long wrong = 0;
  for (const auto& r : rows) wrong += r.wrong;
  print("# {} points, {} wrong elements\n", rows.size(), wrong);
  return wrong == 0 ? 0 : 1;
}

// One process per rank, over TCP or shared memory.
template <class Transport>
int run_processes(const options& o) {
  communicator_options co;
  co.segment_bytes = o.segment_bytes;
  communicator<Transport> c(Transport::from_environment(), co);
  const std::string what = std::string(o.transport == "shm" ? "shared-memory" : "TCP") + " transport (" + o.progress +
                           " progress), one process per rank";
  return run_all(o, c.size(), c.rank() == 0, what,
                 [&](coll_op op, algorithm a, std::size_t bytes) { return measure_on(c, o, op, a, bytes); });
}

// On hosts: the flat algorithms on the hierarchical communicator's whole group, then the two
// allreduce variants through it.
template <class Transport>
int run_tcp_hosts(const options& o) {
  communicator_options co;
  co.segment_bytes = o.segment_bytes;
  process_group world(Transport::from_environment());
  hierarchical_communicator<Transport> h(world, co);
  const two_level_costs k = h.calibrate();
  communicator_options flat_options = co;
  flat_options.tag = co.tag + 1;  // the flat rows' own communicator, apart from h's
  communicator<process_group<Transport>> flat(world, flat_options);
  two_level_view<hierarchical_communicator<Transport>> view{h};
  const auto& hosts = h.hosts();
  const std::string what = "TCP transport (" + o.progress + " progress) on " + std::to_string(hosts.hosts) +
                           " hosts of " + std::to_string(hosts.local_size) + " ranks (DTRAIN_HOST_ID or host name)";
  if (h.rank() == 0) {
    fmt::print("# calibrated: inside a host alpha {:.1f} us, {:.2f} GB/s; between hosts alpha {:.1f} us, {:.3f} GB/s; "
               "reduction {:.2f} GB/s; {:.1f} us per call\n",
               k.alpha_local * 1e6, 1e-9 / k.beta_local, k.alpha_cross * 1e6, 1e-9 / k.beta_cross, 1e-9 / k.gamma,
               k.call * 1e6);
    // For bench/simulate_scale (and bench/validate_scale.py): the constants in its flags' units.
    fmt::print("# simulate_scale: --alpha-local {:.3f} --gbps-local {:.4f} --alpha-cross {:.3f} --gbps-cross {:.4f} "
               "--gbps-reduce {:.4f} --call {:.3f}\n",
               k.alpha_local * 1e6, 1e-9 / k.beta_local, k.alpha_cross * 1e6, 1e-9 / k.beta_cross, 1e-9 / k.gamma,
               k.call * 1e6);
  }
  auto through = [&](hierarchy when) {
    return [&, when](std::size_t bytes) {
      h.set_hierarchy(when);
      bench::row r = measure_on(view, o, coll_op::allreduce, algorithm::automatic, bytes);
      h.set_hierarchy(hierarchy::automatic);
      if (when == hierarchy::automatic) {  // say what the model chose
        const auto plan = h.plan_for(bytes);
        r.algo = "auto:" + std::string(plan.two_levels ? "hierarchical" : algorithm_name(plan.flat));
      }
      return r;
    };
  };
  const std::vector<variant> variants{{"hierarchical", through(hierarchy::always)},
                                      {"auto", through(hierarchy::automatic)}};
  return run_all(
      o, h.size(), h.rank() == 0, what,
      [&](coll_op op, algorithm a, std::size_t bytes) { return measure_on(flat, o, op, a, bytes); }, variants);
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{"dtrain collectives over the in-process or TCP transport (nccl-tests columns)"};
  app.add_option("-n,--ranks", o.ranks, "ranks (threads)")->check(CLI::Range(1, 64));
  app.add_option("-b,--min-bytes", o.min_bytes, "smallest size");
  app.add_option("-e,--max-bytes", o.max_bytes, "largest size");
  app.add_option("-f,--step-factor", o.step, "size multiplier between points")->check(CLI::Range(2, 1024));
  app.add_option("-t,--seconds", o.seconds, "timed seconds per point");
  app.add_option("--ops", o.ops, "collectives to run");
  app.add_option("--json", o.json, "write the results as JSON to this file");
  app.add_option("--segment-bytes", o.segment_bytes, "pipeline segment size of the communicator");
  app.add_option("--algorithms", o.algorithms, "only these algorithms (default: every one)");
  app.add_option("--transport", o.transport, "inproc (threads) or tcp (one process per rank, under dtrain-run "
                 "or mpirun; tcp-hosts: also the hierarchical allreduce; shm: shared memory, one host)")
      ->check(CLI::IsMember({"inproc", "tcp", "tcp-hosts", "shm"}));
  app.add_option("--progress", o.progress, "waiting policy of the process transports (default: spin up to 1 ms "
                 "where the host has two cores per rank, else block; spin: up to 1 ms; blocking)")
      ->check(CLI::IsMember({"default", "blocking", "spin"}));
  CLI11_PARSE(app, argc, argv);

  if (o.transport == "tcp-hosts") {
    return with_progress<basic_tcp_transport>(o.progress,
                                              [&](auto t) { return run_tcp_hosts<typename decltype(t)::type>(o); });
  }
  if (o.transport == "tcp") {
    return with_progress<basic_tcp_transport>(o.progress,
                                              [&](auto t) { return run_processes<typename decltype(t)::type>(o); });
  }
  if (o.transport == "shm") {
    return with_progress<basic_shm_transport>(o.progress,
                                              [&](auto t) { return run_processes<typename decltype(t)::type>(o); });
  }
  return run_all(o, o.ranks, true, "in-process transport (threads)",
                 [&](coll_op op, algorithm a, std::size_t bytes) { return measure_inproc(o, op, a, bytes); });
}
