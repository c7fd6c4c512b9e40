// Collectives on device buffers, in nccl-tests' columns: NCCL (one rank per GPU; world size 1 on
// a single GPU) and TCP-staged ranks (any number sharing a GPU). Launch with dtrain-run:
//
//   dtrain-run -n 1 build-cuda/bench/bench_device_collectives --collective nccl
//   dtrain-run -n 2 build-cuda/bench/bench_device_collectives --collective staged
//
//   size count type redop root | time algbw busbw #wrong

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "device_collectives.hpp"
#include "dtrain/collective/communicator.hpp"
#include "dtrain/collective/nccl.hpp"
#include "dtrain/transport/tcp.hpp"
#include "report.hpp"

using namespace dtrain;

namespace {

coll_op op_named(const std::string& s) {
  for (coll_op op : {coll_op::allreduce, coll_op::allgather, coll_op::reduce_scatter, coll_op::alltoall, coll_op::broadcast}) {
    if (coll_op_name(op) == s) return op;
  }
  throw error(errc::invalid_argument, "no device benchmark for '" + s + "'");
}

}  // namespace

int main(int argc, char** argv) {
  std::string collective = "nccl", json;
  std::vector<std::string> ops{"allreduce", "allgather", "reduce_scatter", "broadcast", "alltoall"};
  std::size_t min_bytes = std::size_t{1} << 10, max_bytes = std::size_t{256} << 20;
  int step = 4;
  bench::device_plan plan;
  CLI::App app{"dtrain collectives on GPU buffers: NCCL, or staged over TCP (nccl-tests columns; launch with dtrain-run)"};
  app.add_option("--collective", collective, "nccl or staged")->check(CLI::IsMember({"nccl", "staged"}))->capture_default_str();
  app.add_option("--ops", ops, "collectives")->delimiter(',')->capture_default_str();
  app.add_option("-b,--min-bytes", min_bytes, "smallest size")->capture_default_str();
  app.add_option("-e,--max-bytes", max_bytes, "largest size")->capture_default_str();
  app.add_option("-f,--step-factor", step, "size multiplier between points")->check(CLI::Range(2, 1024))->capture_default_str();
  app.add_option("-w,--warmup", plan.warmup, "untimed calls per point")->capture_default_str();
  app.add_option("-n,--iters", plan.iterations, "timed calls per point")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--json", json, "write the rows as JSON (rank 0)");
  CLI11_PARSE(app, argc, argv);
  try {
    if (cuda::device_count() == 0) throw error(errc::device_error, "no CUDA device is visible: this benchmark needs a GPU");
    for (const auto& name : ops) plan.ops.push_back(op_named(name));
    for (std::size_t b = min_bytes; b <= max_bytes; b *= static_cast<std::size_t>(step)) plan.sizes.push_back(b);

    auto tcp = tcp_transport::from_environment();
    const int rank = tcp.rank(), size = tcp.size();
    std::vector<bench::device_point> points;
    if (collective == "nccl") {
      communicator<tcp_transport> host(std::move(tcp));
      auto nccl = nccl_communicator::over(host);
      for (coll_op op : plan.ops) {
        for (std::size_t bytes : plan.sizes) points.push_back(bench::measure_device(nccl, op, bytes, plan.warmup, plan.iterations));
      }
    } else {
      const char* local = std::getenv("DTRAIN_LOCAL_RANK");
      cuda::check(cudaSetDevice((local != nullptr ? std::atoi(local) : 0) % cuda::device_count()), "cudaSetDevice");
      points = bench::run_staged(any_transport(std::move(tcp)), plan);
    }
    if (rank != 0) return 0;
    int device = 0;
    cudaDeviceProp prop{};
    cuda::check(cudaGetDevice(&device), "cudaGetDevice");
    cuda::check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    fmt::print("# dtrain bench_device_collectives: {} ranks, {}, on {}\n", size,
               collective == "nccl" ? "NCCL" : "device buffers staged over TCP, reduced by Thrust", prop.name);
    fmt::print("# {:>12} {:>12} {:>8} {:>6} {:>5} | {:>10} {:>9} {:>9} {:>7}  {}\n", "size(B)", "count", "type", "redop",
               "root", "time(us)", "algbw", "busbw", "#wrong", "op");
    std::vector<bench::row> rows;
    long wrong = 0;
    std::size_t k = 0;
    for (coll_op op : plan.ops) {
      for (std::size_t s = 0; s < plan.sizes.size(); ++s, ++k) {
        const auto& p = points[k];
        bench::row r;
        r.op = std::string(coll_op_name(op));
        r.algo = collective;
        r.type = "float32";
        r.redop = op == coll_op::allreduce || op == coll_op::reduce_scatter ? "sum" : "none";
        r.ranks = size;
        r.bytes = p.bytes;
        r.count = p.count;
        r.seconds = p.seconds;
        r.algbw = static_cast<double>(p.bytes) / p.seconds / 1e9;
        r.busbw = r.algbw * bench::busbw_factor(op, size);
        r.wrong = p.wrong;
        wrong += p.wrong;
        fmt::print("  {:>12} {:>12} {:>8} {:>6} {:>5} | {:>10.1f} {:>9.2f} {:>9.2f} {:>7}  {}\n", r.bytes, r.count, r.type,
                   r.redop, op == coll_op::broadcast ? "0" : "-", r.seconds * 1e6, r.algbw, r.busbw, r.wrong, r.op);
        rows.push_back(r);
      }
    }
    bench::write_file(json, bench::json_of(rows));
    fmt::print("# {} points, {} wrong elements (rank 0)\n", rows.size(), wrong);
    return wrong == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_device_collectives: %s\n", e.what());
    return 1;
  }
}
