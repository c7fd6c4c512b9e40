// Device reduction throughput against a device-to-device copy, in the same run, on one GPU:
// dtrain's Thrust reduction (CUDA system, stream-ordered) sums one buffer into another; the
// copy is cudaMemcpyAsync. GB/s counts bytes read and written: 3n for dst += src, 2n for a
// copy. Built in a CUDA build (-DDTRAIN_THRUST_DEVICE_SYSTEM=CUDA):
//
//   build-cuda/bench/bench_device_reduce [--min-mib 1 --max-mib 1024] [--json device_reduce.json]

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "device_reduce_kernels.hpp"
#include "dtrain/cuda/runtime.hpp"
#include "report.hpp"

using namespace dtrain;

int main(int argc, char** argv) {
  std::size_t min_mib = 1, max_mib = 1024;
  std::string json;
  CLI::App app{"dtrain device reduction throughput against a device-to-device copy"};
  app.add_option("--min-mib", min_mib, "smallest buffer, MiB");
  app.add_option("--max-mib", max_mib, "largest buffer, MiB");
  app.add_option("--json", json, "write the results as JSON");
  CLI11_PARSE(app, argc, argv);
  if (cuda::device_count() == 0) {
    fmt::print("bench_device_reduce: no CUDA device visible\n");
    return 77;
  }
  cudaDeviceProp prop{};
  cuda::check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  fmt::print("# dtrain bench_device_reduce on {}: dst += src (float) vs cudaMemcpyAsync D2D\n", prop.name);
  fmt::print("# {:>10} {:>12} {:>12} {:>12} {:>12} {:>8}\n", "size(B)", "reduce(us)", "reduce GB/s", "copy(us)",
             "copy GB/s", "ratio");
  const std::size_t max_n = (max_mib << 20) / sizeof(float);
  cuda::device_buffer<float> dst(max_n), src(max_n);
  cuda::check(cudaMemset(dst.data(), 0, max_n * sizeof(float)), "cudaMemset");
  cuda::check(cudaMemset(src.data(), 0, max_n * sizeof(float)), "cudaMemset");
  cuda::stream stream;
  std::string out = "[\n";
  for (std::size_t mib = min_mib; mib <= max_mib; mib *= 2) {
    const std::size_t bytes = mib << 20, n = bytes / sizeof(float);
    const int iterations = static_cast<int>(std::clamp<std::size_t>((std::size_t{4} << 30) / bytes, 5, 1000));
    const double reduce = bench::reduce_ms(dst.data(), src.data(), n, stream.get(), iterations);
    const double copy = bench::copy_ms(dst.data(), src.data(), n, stream.get(), iterations);
    const double reduce_gbps = 3.0 * static_cast<double>(bytes) / (reduce * 1e-3) / 1e9;
    const double copy_gbps = 2.0 * static_cast<double>(bytes) / (copy * 1e-3) / 1e9;
    fmt::print("  {:>10} {:>12.1f} {:>12.1f} {:>12.1f} {:>12.1f} {:>8.3f}\n", bytes, reduce * 1e3, reduce_gbps,
               copy * 1e3, copy_gbps, reduce_gbps / copy_gbps);
    out += fmt::format("  {{\"device\": \"{}\", \"bytes\": {}, \"reduce_us\": {:.2f}, \"reduce_GBps\": {:.1f}, "
                       "\"copy_us\": {:.2f}, \"copy_GBps\": {:.1f}, \"ratio\": {:.4f}}}{}\n",
                       prop.name, bytes, reduce * 1e3, reduce_gbps, copy * 1e3, copy_gbps, reduce_gbps / copy_gbps,
                       mib * 2 <= max_mib ? "," : "");
  }
  bench::write_file(json, out + "]\n");
  return 0;
}
