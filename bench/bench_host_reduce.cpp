// The host reduction against a plain `a[i] += b[i]` loop and memcpy, all compiled here with
// -O3 -march=native, on buffers of --mib MiB. Bandwidth counts bytes read and written:
// 3n for a reduction (read a, read b, write a), 2n for a copy.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "dtrain/reduce/host.hpp"
#include "report.hpp"

namespace {

// The baseline the issue names; noinline so it is compiled as its own loop, like a user's.
[[gnu::noinline]] void plain_add(float* a, const float* b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) a[i] += b[i];
}

template <class F>
double best_seconds(int reps, F&& f) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// Elements of one reduction that differ, bit for bit, from a scalar loop in the compute type
// (float for the 16-bit types, rounded back): the kernels this file times are built with -O3
// -march=native (F16C, AVX), which the test programs are not. Floating inputs are random in
// [-4, 4], so sums and products round, and the 16-bit types meet ties; integers stay in
// [-1000, 1000], so products do not overflow.
template <class T>
long wrong_elements(std::size_t n, dtrain::reduce_op op) {
  using C = dtrain::compute_type_t<T>;
  std::mt19937_64 gen(n + static_cast<std::size_t>(op));
  std::uniform_real_distribution<double> real(-4, 4);
  std::uniform_int_distribution<int> whole(-1000, 1000);
  auto draw = [&] {
    if constexpr (std::is_integral_v<C>) return static_cast<T>(static_cast<C>(whole(gen)));
    else return static_cast<T>(static_cast<C>(real(gen)));
  };
  std::vector<T> a(n), b(n), want(n);
  for (std::size_t i = 0; i < n; ++i) {
    a[i] = draw();
    b[i] = draw();
    const C x = static_cast<C>(a[i]), y = static_cast<C>(b[i]);
    const C r = op == dtrain::reduce_op::prod ? static_cast<C>(x * y)
                : op == dtrain::reduce_op::min ? (y < x ? y : x)
                : op == dtrain::reduce_op::max ? (x < y ? y : x)
                                               : static_cast<C>(x + y);  // sum, and avg (which combines as sum)
    want[i] = static_cast<T>(r);
  }
  dtrain::host_reduction{}(std::span<T>(a), std::span<const T>(b), op);
  long wrong = 0;
  for (std::size_t i = 0; i < n; ++i) wrong += std::memcmp(&a[i], &want[i], sizeof(T)) != 0;
  return wrong;
}

template <class T>
double reduce_gbps(std::size_t bytes, dtrain::reduce_op op, int reps, long& wrong) {
  std::size_t n = bytes / sizeof(T);
  std::vector<T> a(n, static_cast<T>(static_cast<dtrain::compute_type_t<T>>(1))), b(a);
  dtrain::host_reduction reduce;
  double s = best_seconds(reps, [&] { reduce(std::span<T>(a), std::span<const T>(b), op); });
  // The kernels take no size-dependent path: checked on up to 2^20 elements (the benchmark's whole
  // buffer at --mib 1), plus a tail shorter than a vector, not on every MiB the run times.
  wrong += wrong_elements<T>(std::min<std::size_t>(n, std::size_t{1} << 20) + 3, op);
  return 3.0 * static_cast<double>(n * sizeof(T)) / s / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t mib = 64;
  int reps = 20;
  std::string json;
  CLI::App app{"dtrain host reduction vs a plain loop and memcpy"};
  app.add_option("--mib", mib, "buffer size in MiB");
  app.add_option("--reps", reps, "repetitions (best is reported)");
  app.add_option("--json", json, "write the results as JSON to this file");
  CLI11_PARSE(app, argc, argv);

  const std::size_t bytes = mib << 20;
  const std::size_t n = bytes / sizeof(float);
  std::vector<float> a(n, 1.0f), b(n, 2.0f), c(n);
  dtrain::host_reduction reduce;
  // Interleave the contenders so that frequency and cache effects hit all of them alike.
  double plain = 1e30, ours = 1e30, copy = 1e30;
  for (int round = 0; round < 3; ++round) {
    plain = std::min(plain, best_seconds(reps, [&] { plain_add(a.data(), b.data(), n); }));
    ours = std::min(ours, best_seconds(reps, [&] {
                      reduce(std::span<float>(a), std::span<const float>(b), dtrain::reduce_op::sum);
                    }));
    copy = std::min(copy, best_seconds(reps, [&] { std::memcpy(c.data(), b.data(), bytes); }));
  }
  auto gbps = [&](double s, double factor) { return factor * static_cast<double>(bytes) / s / 1e9; };
  fmt::print("# host reduction, float32, {} MiB buffers, best of {}x3 runs\n", mib, reps);
  fmt::print("{:<28} {:>10} {:>10} {:>9}\n", "kernel", "time(ms)", "GB/s", "vs plain");
  fmt::print("{:<28} {:>10.3f} {:>10.2f} {:>9.3f}\n", "plain a[i] += b[i]", plain * 1e3, gbps(plain, 3), 1.0);
  fmt::print("{:<28} {:>10.3f} {:>10.2f} {:>9.3f}\n", "dtrain host_reduction sum", ours * 1e3, gbps(ours, 3),
             plain / ours);
  fmt::print("{:<28} {:>10.3f} {:>10.2f} {:>9}\n", "memcpy", copy * 1e3, gbps(copy, 2), "-");

  fmt::print("\n# every op and type, {} MiB, GB/s (3 bytes moved per byte reduced)\n", mib);
  fmt::print("{:<10} {:>9} {:>9} {:>9} {:>9} {:>9}\n", "type", "sum", "prod", "min", "max", "avg");
  std::string rows;
  long wrong = 0;
  auto line = [&]<class T>(const char* name) {
    std::vector<double> g;
    for (auto op : {dtrain::reduce_op::sum, dtrain::reduce_op::prod, dtrain::reduce_op::min,
                    dtrain::reduce_op::max, dtrain::reduce_op::avg}) {
      g.push_back(reduce_gbps<T>(bytes, op, std::max(3, reps / 4), wrong));
    }
    fmt::print("{:<10} {:>9.2f} {:>9.2f} {:>9.2f} {:>9.2f} {:>9.2f}\n", name, g[0], g[1], g[2], g[3], g[4]);
    rows += fmt::format(
        "{}{{\"type\": \"{}\", \"sum\": {:.3f}, \"prod\": {:.3f}, \"min\": {:.3f}, \"max\": {:.3f}, \"avg\": {:.3f}}}",
        rows.empty() ? "" : ",\n    ", name, g[0], g[1], g[2], g[3], g[4]);
  };
  line.operator()<float>("float32");
  line.operator()<double>("float64");
  line.operator()<std::int32_t>("int32");
  line.operator()<std::int64_t>("int64");
  line.operator()<dtrain::float16>("float16");
  line.operator()<dtrain::bfloat16>("bfloat16");
  dtrain::bench::write_file(
      json,
      fmt::format("{{\n  \"mib\": {},\n  \"plain_add_GBps\": {:.3f},\n  \"host_reduction_GBps\": {:.3f},\n"
                  "  \"memcpy_GBps\": {:.3f},\n  \"ratio_to_plain\": {:.4f},\n  \"wrong\": {},\n"
                  "  \"by_type\": [\n    {}\n  ]\n}}\n",
                  mib, gbps(plain, 3), gbps(ours, 3), gbps(copy, 2), plain / ours, wrong, rows));
  fmt::print("\n# {} wrong elements (every op and type against a scalar loop)\n", wrong);
  return wrong == 0 ? 0 : 1;
}
