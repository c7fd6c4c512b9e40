// Collectives on device buffers, in nccl-tests' columns: NCCL (one rank per GPU; world size 1 on
// a single GPU) and TCP-staged ranks (any number sharing a GPU). Launch with dtrain-run:
//
//   dtrain-run -n 1 build-cuda/bench/bench_device_collectives --collective nccl
//   dtrain-run -n 2 build-cuda/bench/bench_device_collectives --collective staged
//   dtrain-run -n 1 build-cuda/bench/bench_device_collectives --ops allreduce --peer --rounds 3
//   dtrain-run -n 2 build-cuda/bench/bench_device_collectives --collective staged --ops sendrecv
//   dtrain-run -n 2 build-cuda/bench/bench_device_collectives --collective nccl --ops sendrecv  # 2 GPUs
//
// sendrecv: the one-way time of a device buffer sent point to point between rank pairs, and beside
// it a cudaMemcpy round trip through pinned memory (the staged path's staging alone).
//
// --peer adds, for NCCL's allreduce, ncclAllReduce called directly (bench/nccl_peer.hpp), each
// call synchronised as dtrain's blocking calls are, and dtrain's iallreduce against raw calls
// enqueued back to back (nccl-tests' way), alternated round by round; the summary gives
// dtrain / raw NCCL throughput per size, the median over rounds.
//
//   size count type redop root | time algbw busbw #wrong

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "device_collectives.hpp"
#include "dtrain/collective/communicator.hpp"
#include "dtrain/collective/nccl.hpp"
#include "dtrain/transport/tcp.hpp"
#include "nccl_peer.hpp"
#include "report.hpp"

using namespace dtrain;

namespace {

coll_op op_named(const std::string& s) {
  if (s == "sendrecv") return coll_op::message;  // point-to-point, staged only
  for (coll_op op :
       {coll_op::allreduce, coll_op::allgather, coll_op::reduce_scatter, coll_op::alltoall, coll_op::broadcast}) {
    if (coll_op_name(op) == s) return op;
  }
  throw error(errc::invalid_argument, "no device benchmark for '" + s + "'");
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Raw ncclAllReduce on `bytes` of floats: the slowest rank's seconds per call.
template <class Host>
double raw_allreduce_seconds(bench::raw_nccl& raw, Host& host, std::size_t bytes, int warmup, int iterations,
                             bool blocking) {
  const std::size_t n = std::max<std::size_t>(1, bytes / sizeof(float));
  std::vector<float> values(n);
  for (std::size_t i = 0; i < n; ++i) values[i] = bench::detail::input_of(host.rank(), i);
  cuda::device_buffer<float> in(n), out(n);
  cuda::check(cudaMemcpy(in.data(), values.data(), n * sizeof(float), cudaMemcpyHostToDevice), "H2D");
  double seconds = raw.allreduce_seconds(in.data(), out.data(), n, warmup, iterations, blocking);
  host.allreduce(std::span<double>(&seconds, 1), reduce_op::max);
  return seconds;
}

// NCCL's allreduce four ways, alternated for `rounds` rounds: dtrain's blocking calls and raw
// NCCL synchronised after each call, dtrain's calls in flight and raw NCCL enqueued back to back.
// One point each, the median time over rounds (dtrain's points carry every round's wrong elements).
template <class Host>
std::vector<bench::device_point> allreduce_against_raw(nccl_communicator& nccl, bench::raw_nccl& raw, Host& host,
                                                       std::size_t bytes, const bench::device_plan& plan, int rounds) {
  std::vector<double> blocking, raw_blocking, in_flight, raw_in_flight;
  bench::device_point b, f;
  for (int k = 0; k < rounds; ++k) {
    const auto pb = bench::measure_device(nccl, coll_op::allreduce, bytes, plan.warmup, plan.iterations);
    raw_blocking.push_back(raw_allreduce_seconds(raw, host, bytes, plan.warmup, plan.iterations, true));
    const auto pf = bench::measure_device(nccl, coll_op::allreduce, bytes, plan.warmup, plan.iterations, true);
    raw_in_flight.push_back(raw_allreduce_seconds(raw, host, bytes, plan.warmup, plan.iterations, false));
    blocking.push_back(pb.seconds);
    in_flight.push_back(pf.seconds);
    b = {pb.op, pb.count, pb.bytes, 0, b.wrong + pb.wrong, "nccl"};
    f = {pf.op, pf.count, pf.bytes, 0, f.wrong + pf.wrong, "nccl-inflight"};
  }
  b.seconds = median(blocking);
  f.seconds = median(in_flight);
  return {b, {b.op, b.count, b.bytes, median(raw_blocking), 0, "raw-nccl-sync"}, f,
          {b.op, b.count, b.bytes, median(raw_in_flight), 0, "raw-nccl"}};
}

// For each size measured against raw NCCL (--peer), dtrain's time over raw NCCL's: one call at a
// time, and in flight.
void print_ratios_to_raw(const std::vector<bench::row>& rows) {
  auto seconds_of = [&](std::size_t bytes, std::string_view algo) {
    auto it = std::ranges::find_if(rows, [&](const bench::row& r) { return r.bytes == bytes && r.algo == algo; });
    return it == rows.end() ? 0.0 : it->seconds;
  };
  for (const auto& r : rows) {
    if (r.algo != "raw-nccl") continue;
    fmt::print("# {:>12} bytes: dtrain / raw NCCL throughput: one call at a time {:.3f}, in flight {:.3f}\n", r.bytes,
               seconds_of(r.bytes, "raw-nccl-sync") / seconds_of(r.bytes, "nccl"),
               r.seconds / seconds_of(r.bytes, "nccl-inflight"));
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string collective = "nccl", json;
  std::vector<std::string> ops{"allreduce", "allgather", "reduce_scatter", "broadcast", "alltoall"};
  std::size_t min_bytes = std::size_t{1} << 10, max_bytes = std::size_t{256} << 20;
  int step = 4, rounds = 3;
  bool peer = false;
  bench::device_plan plan;
  CLI::App app{
      "dtrain collectives on GPU buffers: NCCL, or staged over TCP (nccl-tests columns; launch with dtrain-run)"};
  app.add_option("--collective", collective, "nccl or staged")
      ->check(CLI::IsMember({"nccl", "staged"}))
      ->capture_default_str();
  app.add_option("--ops", ops, "collectives")->delimiter(',')->capture_default_str();
  app.add_option("-b,--min-bytes", min_bytes, "smallest size")->capture_default_str();
  app.add_option("-e,--max-bytes", max_bytes, "largest size")->capture_default_str();
  app.add_option("-f,--step-factor", step, "size multiplier between points")
      ->check(CLI::Range(2, 1024))
      ->capture_default_str();
  app.add_option("-w,--warmup", plan.warmup, "untimed calls per point")->capture_default_str();
  app.add_option("-n,--iters", plan.iterations, "timed calls per point")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--json", json, "write the rows as JSON (rank 0)");
  app.add_flag("--peer", peer, "NCCL allreduce: also raw ncclAllReduce and dtrain's calls in flight, alternated");
  app.add_option("--rounds", rounds, "rounds of the --peer comparison (median)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    if (cuda::device_count() == 0)
      throw error(errc::device_error, "no CUDA device is visible: this benchmark needs a GPU");
    for (const auto& name : ops) plan.ops.push_back(op_named(name));
    for (std::size_t b = min_bytes; b <= max_bytes; b *= static_cast<std::size_t>(step)) plan.sizes.push_back(b);

    auto tcp = tcp_transport::from_environment();
    const int rank = tcp.rank(), size = tcp.size();
    std::vector<bench::device_point> points;
    if (collective == "nccl") {
      communicator<tcp_transport> host(std::move(tcp));
      nccl_options o;
      o.point_to_point = std::find(plan.ops.begin(), plan.ops.end(), coll_op::message) != plan.ops.end();
      auto nccl = nccl_communicator::over(host, o);
      std::optional<bench::raw_nccl> raw;
      if (peer) raw.emplace(host);
      for (coll_op op : plan.ops) {
        for (std::size_t bytes : plan.sizes) {
          if (op == coll_op::message) {
            for (auto& p : bench::measure_p2p(nccl, "nccl", bytes, plan.warmup, plan.iterations)) points.push_back(p);
          } else if (raw && op == coll_op::allreduce) {
            for (auto& p : allreduce_against_raw(nccl, *raw, host, bytes, plan, rounds)) points.push_back(p);
          } else {
            points.push_back(bench::measure_device(nccl, op, bytes, plan.warmup, plan.iterations));
          }
        }
      }
    } else {
      cuda::check(cudaSetDevice(cuda::local_device()), "cudaSetDevice");
      points = bench::run_staged(any_transport(std::move(tcp)), plan);
    }
    if (rank != 0) return 0;
    int device = 0;
    cudaDeviceProp prop{};
    cuda::check(cudaGetDevice(&device), "cudaGetDevice");
    cuda::check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    fmt::print("# dtrain bench_device_collectives: {} ranks, {}, on {}\n", size,
               collective == "nccl" ? "NCCL" : "device buffers staged over TCP, reduced by Thrust", prop.name);
    fmt::print("# {:>12} {:>12} {:>8} {:>6} {:>5} | {:>10} {:>9} {:>9} {:>7}  {}\n", "size(B)", "count", "type",
               "redop", "root", "time(us)", "algbw", "busbw", "#wrong", "op algorithm");
    std::vector<bench::row> rows;
    long wrong = 0;
    for (const auto& p : points) {
      bench::row r;
      r.op = p.op == coll_op::message ? "sendrecv" : std::string(coll_op_name(p.op));
      r.algo = p.algo.empty() ? collective : p.algo;
      r.type = "float32";
      r.redop = p.op == coll_op::allreduce || p.op == coll_op::reduce_scatter ? "sum" : "none";
      r.ranks = size;
      r.bytes = p.bytes;
      r.count = p.count;
      r.seconds = p.seconds;
      r.algbw = static_cast<double>(p.bytes) / p.seconds / 1e9;
      r.busbw = r.algbw * bench::busbw_factor(p.op, size);
      r.wrong = p.wrong;
      wrong += p.wrong;
      fmt::print("  {:>12} {:>12} {:>8} {:>6} {:>5} | {:>10.1f} {:>9.2f} {:>9.2f} {:>7}  {} {}\n", r.bytes, r.count,
                 r.type, r.redop, p.op == coll_op::broadcast ? "0" : "-", r.seconds * 1e6, r.algbw, r.busbw, r.wrong,
                 r.op, r.algo);
      rows.push_back(r);
    }
    print_ratios_to_raw(rows);
    bench::write_file(json, bench::json_of(rows));
    fmt::print("# {} points, {} wrong elements (rank 0)\n", rows.size(), wrong);
    return wrong == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_device_collectives: %s\n", e.what());
    return 1;
  }
}
