// ps-lite running bench_ps's measurements, for same-run ratios (bench/ps_throughput.py --pslite).
// Built only against a ps-lite you built yourself (never vendored here): configure dtrain with
// -DDTRAIN_PSLITE_DIR=<ps-lite checkout with build/libps.a>, and launch with ps-lite's own
// launcher, e.g. `timeout 300 <ps-lite>/tests/local.sh 2 2 build/bench/pslite_push_pull --json f`.
//
// Semantics, matched to bench_ps (ASP, one request in flight per tensor, SGD on the servers):
//  - Dense: a tensor is cut into slices of at most --slice-kib, slice j given a key in server
//    (j mod S)'s key range, so a tensor spreads over the servers as bench_ps's slices do. One
//    ZPush / ZPull / ZPushPull per tensor; ps-lite splits it into one message per server.
//  - The server keeps one float buffer per key set a request carries (a tensor's slices on that
//    server, the same every time), applies SGD to it (lr 1e-6, as bench_ps) and answers pulls
//    from it without copying (an SArray over the buffer).
//  - Sparse (--keys N): N random keys, spread over the servers' ranges, pushed and pulled with
//    ZPushPull through ps-lite's KVServerDefaultHandle (it adds the push to a hash map), no key
//    caching (ps-lite has none).
//  - GB/s counts value bytes of all workers (push: the tensor; pull: the tensor; push+pull:
//    both), M keys/s keys per push+pull of all workers: bench_ps's definitions. Worker 0 reports.
//  - StartAsync and a barrier over every group before the first request: with Start, some
//    launches hang (ps-lite issue 152).

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "ps/ps.h"
#include "../report.hpp"

namespace {

constexpr int sparse_cmd = 1;

// The server's handle: SGD on a buffer per dense key set, ps-lite's default handle for sparse keys.
struct server_handle {
  std::unordered_map<ps::Key, std::vector<float>> dense;  // by the first key of the request
  ps::KVServerDefaultHandle<float> sparse;

  void operator()(const ps::KVMeta& meta, const ps::KVPairs<float>& data, ps::KVServer<float>* server) {
    if (meta.cmd == sparse_cmd) {
      sparse(meta, data, server);
      return;
    }
    std::vector<float>& w = dense[data.keys[0]];
    if (meta.push) {
      if (w.empty()) w.assign(data.vals.size(), 0.0f);
      for (std::size_t i = 0; i < w.size(); ++i) w[i] -= 1e-6f * data.vals[i];
    }
    ps::KVPairs<float> res;
    if (meta.pull) {
      res.keys = data.keys;
      res.vals = ps::SArray<float>(w.data(), w.size(), false);  // no copy: the reply points into w
      res.lens = data.lens;  // a push+pull carries them (and wants them back); a pull does not
    }
    server->Response(meta, res);
  }
};

struct result {
  std::string what;
  std::size_t bytes = 0, keys = 0;
  double seconds = 0, gbps = 0, mkeys = 0;
};

// One dense tensor as ps-lite sees it: sorted keys, a length per key, and its buffers.
struct tensor {
  ps::SArray<ps::Key> keys;
  ps::SArray<int> lens;
  ps::SArray<float> grad, values;
};

tensor make_tensor(std::size_t floats, std::size_t slice_floats, int index) {
  const auto& ranges = ps::Postoffice::Get()->GetServerKeyRanges();
  std::vector<std::pair<ps::Key, int>> slices;
  const std::size_t n = (floats + slice_floats - 1) / slice_floats;
  for (std::size_t j = 0; j < n; ++j) {
    const auto& r = ranges[j % ranges.size()];
    slices.emplace_back(r.begin() + static_cast<ps::Key>(index) * 1024 + j,
                        static_cast<int>(std::min(slice_floats, floats - j * slice_floats)));
  }
  std::sort(slices.begin(), slices.end());
  tensor t;
  for (const auto& [key, len] : slices) {
    t.keys.push_back(key);
    t.lens.push_back(len);
  }
  t.grad = ps::SArray<float>(floats, 1e-3f);
  t.values = ps::SArray<float>(floats, 0.0f);
  return t;
}

void barrier_workers() { ps::Postoffice::Get()->Barrier(0, ps::kWorkerGroup); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ps-lite running bench_ps's dense and sparse push/pull measurements"};
  std::vector<std::size_t> sizes{std::size_t{1} << 20, std::size_t{16} << 20};
  double seconds = 1.0;
  std::size_t sparse_keys = 100000, slice_kib = 4096;
  int depth = 1;
  std::string json, only;
  app.add_option("--sizes", sizes, "dense tensor bytes");
  app.add_option("--depth", depth, "dense tensors of each size in flight per round")->check(CLI::Range(1, 64));
  app.add_option("--seconds", seconds, "time per measurement");
  app.add_option("--keys", sparse_keys, "keys per sparse push+pull");
  app.add_option("--slice-kib", slice_kib, "dense slice size in KiB (bench_ps's default: 4096)");
  app.add_option("--only", only, "measure only dense or only sparse")->check(CLI::IsMember({"dense", "sparse"}));
  app.add_option("--json", json, "write the results as JSON (worker 0)");
  CLI11_PARSE(app, argc, argv);

  ps::StartAsync(0, argv[0]);
  ps::KVServer<float>* server = nullptr;
  if (ps::IsServer()) {
    server = new ps::KVServer<float>(0);
    server->set_request_handle(server_handle{});
  }
  ps::Postoffice::Get()->Barrier(0, ps::kWorkerGroup + ps::kServerGroup + ps::kScheduler);
  if (ps::IsWorker()) {
    ps::KVWorker<float> kv(0, 0);
    const int workers = ps::NumWorkers();
    std::vector<result> results;
    int next_tensor = 0;
    for (std::size_t bytes : sizes) {
      if (only == "sparse") break;
      std::vector<tensor> tensors;
      for (int k = 0; k < depth; ++k) {  // every tensor of every size has keys of its own
        tensors.push_back(make_tensor(bytes / sizeof(float), (slice_kib << 10) / sizeof(float), next_tensor++));
      }
      std::vector<int> ts(tensors.size());
      for (const std::string op : {"push", "pull", "push+pull"}) {
        barrier_workers();
        const double s = dtrain::bench::time_per_call([&] {
          for (std::size_t k = 0; k < tensors.size(); ++k) {
            tensor& t = tensors[k];
            ts[k] = op == "push"   ? kv.ZPush(t.keys, t.grad, t.lens)
                    : op == "pull" ? kv.ZPull(t.keys, &t.values)
                                   : kv.ZPushPull(t.keys, t.grad, &t.values, &t.lens);
          }
          for (int x : ts) kv.Wait(x);
        }, seconds, 3) / depth;
        const double moved = static_cast<double>(bytes) * (op == "push+pull" ? 2 : 1) * workers;
        results.push_back({"dense " + op, bytes, 0, s, moved / s / 1e9, 0});
      }
    }
    if (only != "dense" && sparse_keys > 0) {
      // bench_ps's keys (random in [0, 2^24), sorted, unique), spread over ps-lite's key space.
      std::mt19937_64 gen(static_cast<std::uint64_t>(ps::MyRank()) + 7);
      std::vector<ps::Key> keys(sparse_keys);
      for (auto& k : keys) k = gen() % (std::uint64_t{1} << 24);
      std::sort(keys.begin(), keys.end());
      keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
      for (auto& k : keys) k *= ps::kMaxKey >> 24;
      ps::SArray<ps::Key> skeys(keys);
      ps::SArray<float> grad(keys.size(), 1e-3f), values(keys.size(), 0.0f);
      barrier_workers();
      const double s = dtrain::bench::time_per_call(
          [&] { kv.Wait(kv.ZPushPull(skeys, grad, &values, nullptr, sparse_cmd)); }, seconds, 3);
      results.push_back({"sparse push+pull", keys.size() * sizeof(float), keys.size(), s,
                         2.0 * static_cast<double>(keys.size() * sizeof(float)) * workers / s / 1e9,
                         static_cast<double>(keys.size()) * workers / s / 1e6});
    }
    if (ps::MyRank() == 0) {
      fmt::print("# ps-lite: {} server(s), {} worker(s), {} dense tensor(s) in flight, {} KiB slices\n",
                 ps::NumServers(), workers, depth, slice_kib);
      fmt::print("# {:<18} {:>12} {:>10} {:>12} {:>10} {:>10}\n", "op", "size(B)", "keys", "time(us)", "GB/s",
                 "Mkeys/s");
      std::string out = "[\n";
      for (std::size_t i = 0; i < results.size(); ++i) {
        const auto& r = results[i];
        fmt::print("  {:<18} {:>12} {:>10} {:>12.1f} {:>10.3f} {:>10.2f}\n", r.what, r.bytes, r.keys, r.seconds * 1e6,
                   r.gbps, r.mkeys);
        out += fmt::format(
            "  {{\"op\": \"{}\", \"bytes\": {}, \"keys\": {}, \"time_us\": {:.2f}, \"GBps\": {:.4f}, "
            "\"Mkeys_per_s\": {:.3f}}}{}\n",
            r.what, r.bytes, r.keys, r.seconds * 1e6, r.gbps, r.mkeys, i + 1 < results.size() ? "," : "");
      }
      if (!json.empty()) {
        if (std::FILE* f = std::fopen(json.c_str(), "w")) {
          std::fputs((out + "]\n").c_str(), f);
          std::fclose(f);
        }
      }
    }
  }
  ps::Finalize(0, true);
  delete server;
  return 0;
}
