// Parameter-server throughput over TCP, one process per rank (run under dtrain-run; the first
// --servers ranks serve). Dense push, pull and push+pull of one tensor (sliced over the servers),
// and sparse push+pull of random keys; the servers apply a real updater (SGD) to every
// push. Consistency is ASP, as in ps-lite's benchmark: requests are answered as they come.
//
//   DTRAIN_PS_SERVERS=1 dtrain-run -n 2 build/bench/bench_ps
//   DTRAIN_PS_SERVERS=2 dtrain-run -n 4 build/bench/bench_ps --json ps.json
//   DTRAIN_PS_SERVERS=2 dtrain-run -n 4 build/bench/bench_ps --replicas 2   (chain replication)
//
// GB/s counts the value bytes moved by all workers (push: the tensor; pull: the tensor;
// push+pull: both); M keys/s counts keys per push+pull round (each key pushed and pulled once).
// `--depth K` puts K tensors of each size in flight before a round waits for them, as ps-lite's
// test_benchmark does with its keys (40 per server); time is per tensor.
// push+pull is one `push_pull` request per server (ps-lite's ZPushPull, as its benchmark's
// PUSH_PULL mode): the server applies the push and answers with the new values.
// Every result is checked: each value's step (the learning rate times its gradient) is a small
// odd multiple of 2^-20, so the values are exact multiples of their step, and a worker that pushed k
// times must pull at least k steps; a last tensor and a last set of keys, each pushed three times by
// each worker (twice by push, once by push+pull), must hold exactly three of this worker's steps
// (`wrong` counts the values that break either).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "dtrain/consistency/policies.hpp"
#include "dtrain/ps/server.hpp"
#include "dtrain/ps/worker.hpp"
#include "dtrain/transport/tcp.hpp"
#include "dtrain/updater/sgd.hpp"
#include "report.hpp"

using namespace dtrain;
using namespace dtrain::ps;

namespace {

struct result {
  std::string what;
  std::size_t bytes = 0, keys = 0;
  double seconds = 0, gbps = 0, mkeys = 0;
  long wrong = 0;  // values found wrong after these measurements (this worker's)
};

using worker_t = worker<tcp_transport, asp, float>;

// lr * g[i] = 2^-20 c, c an odd prime up to 19: the sums stay multiples of 2^-20, which float holds
// exactly below 16 (up to 2^24 / 19 steps of the largest), and a value put at another element's
// place shows as a step count that is not a whole number (unless c divides it).
constexpr float lr = 1.0f / 1024;
float gradient(std::size_t i) {
  constexpr int odd[] = {3, 5, 7, 11, 13, 17, 19};
  return static_cast<float>(odd[i % 7]) / 1024;
}

// Elements of `values` that do not hold -(lr g[i]) k for a whole k >= `pushed` (this worker's own
// pushes; other workers' add to k) from the zero the servers start with. From -16 down the sums
// round (a run of about a million pushes): such elements are counted in `unjudged`, not judged.
long wrong_values(std::span<const float> values, std::span<const key_type> keys, long pushed, long& unjudged) {
  long wrong = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const double step = double{lr} * gradient(keys.empty() ? i : keys[i]);
    const double k = -double{values[i]} / step;
    if (std::isfinite(k) && values[i] <= -16) {
      ++unjudged;
      continue;
    }
    wrong += !std::isfinite(k) || k != std::floor(k) || k < static_cast<double>(pushed);
  }
  return wrong;
}

// Values of `values` whose 4 bits of worker `id` do not read 3. Worker w's gradient is
// 2^(4w) / 1024, so at lr 2^-10 each of its pushes adds 2^(4w) * 2^-20 in bits of its own (exact in
// float for up to 6 workers).
long not_three(std::span<const float> values, int id) {
  long wrong = 0;
  for (float v : values) {
    const double k = -std::ldexp(double{v}, 20);  // the sum of every worker's bits
    const bool whole = std::isfinite(k) && k == std::floor(k) && k >= 0 && k < 0x1p24;
    wrong += !whole || ((static_cast<long long>(k) >> (4 * id)) & 15) != 3;
  }
  return wrong;
}

// Pushes twice, then push+pulls into `reply` and pulls into `values`, each acknowledged before the
// next. @returns the values of both that do not read 3 in the worker's bits.
template <class Push, class PushPull, class Pull>
long three_pushes(worker_t& w, std::span<float> reply, std::span<float> values, Push push, PushPull push_pull,
                  Pull pull) {
  std::ranges::fill(reply, std::nanf(""));
  std::ranges::fill(values, std::nanf(""));
  for (int i = 0; i < 2; ++i) {
    auto q = push();
    w.wait(q);
  }
  auto q = push_pull();
  w.wait(q);
  w.wait(q = pull());
  return not_three(reply, w.id()) + not_three(values, w.id());
}

// Exactly once: every worker pushes a fresh dense tensor and a fresh set of keys three times each,
// twice by push and the third time by push+pull. The push+pull's reply and a pull after it must
// read 3 in the worker's bits: a push lost or applied twice, by either request, shows. The keys are
// even, the throughput run's odd. Returns the values that fail.
long wrong_exactly_once(worker_t& w, int workers, bool dense, bool sparse) {
  if (workers > 6) return 0;
  const std::size_t n = 1000;
  const std::vector<float> grad(n, std::ldexp(1.0f, 4 * w.id()) / 1024);
  std::vector<float> reply(n), values(n);
  long wrong = 0;
  if (dense) {
    const std::size_t tensor = w.add_dense(n);
    wrong += three_pushes(
        w, reply, values, [&] { return w.push_dense(tensor, grad); },
        [&] { return w.push_pull_dense(tensor, grad, reply); }, [&] { return w.pull_dense(tensor, values); });
  }
  if (sparse) {
    std::vector<key_type> keys(n);  // even keys spread over every server's range
    for (std::size_t i = 0; i < n; ++i) keys[i] = 2 * i * ((std::uint64_t{1} << 23) / n);
    wrong += three_pushes(
        w, reply, values, [&] { return w.push(keys, grad, 1); }, [&] { return w.push_pull(keys, grad, reply, 1); },
        [&] { return w.pull(keys, values, 1); });
  }
  return wrong;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 1.0;
  std::size_t sparse_keys = 100000;
  std::string json, only;
  CLI::App app{"dtrain parameter-server throughput (run under dtrain-run; DTRAIN_PS_SERVERS servers)"};
  app.add_option("--seconds", seconds, "time per measurement");
  app.add_option("--keys", sparse_keys, "keys per sparse push+pull");
  app.add_option("--json", json, "write the results as JSON (worker 0)");
  std::size_t slice_kib = 4096;
  bool no_key_cache = false;
  app.add_option("--slice-kib", slice_kib, "dense slice size (ps_options::dense_slice_bytes) in KiB");
  std::size_t posted = ps_options{}.posted_requests;
  app.add_option("--posted", posted, "request receives a server keeps posted (ps_options::posted_requests)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1024}));
  app.add_flag("--no-key-cache", no_key_cache, "send every key list in full (ps_options::key_cache_lists = 0)");
  int depth = 1;
  int replicas = 1;
  std::vector<std::size_t> sizes{std::size_t{4} << 10, std::size_t{1} << 20, std::size_t{16} << 20};
  app.add_option("--sizes", sizes, "dense tensor bytes")->check(CLI::Range(std::size_t{4}, std::size_t{1} << 30));
  app.add_option("--depth", depth, "dense tensors of each size in flight per round")->check(CLI::Range(1, 64));
  app.add_option("--replicas", replicas, "copies of each shard (ps_options::replicas, chain replication)");
  app.add_option("--only", only, "measure only dense or only sparse")->check(CLI::IsMember({"dense", "sparse"}));
  CLI11_PARSE(app, argc, argv);

  tcp_options to;
  to.abort_group_on_peer_loss = false;
  auto t = tcp_transport::from_environment(to);
  const roles r = roles::from_environment(t.size());
  ps_options o;
  o.dense_slice_bytes = slice_kib << 10;
  o.posted_requests = posted;
  if (no_key_cache) o.key_cache_lists = 0;
  o.replicas = replicas;
  if (r.is_server(t.rank())) {
    server<tcp_transport, asp, float, sgd<float>> s(std::move(t), r, asp{}, sgd<float>(lr), {}, o);
    s.run();
    if (replicas > 1) {
      const auto& c = s.replication();
      fmt::print("# server {}: {} updates down its chain, {} replies held for the tail\n", s.shard(), c.forwarded,
                 c.held_replies);
    }
    return 0;
  }
  worker_t w(std::move(t), r, range_sharding(r.shard_count(), std::uint64_t{1} << 24), o);
  std::vector<result> results;
  long unjudged = 0;  // values past float's exact range
  for (std::size_t bytes : sizes) {
    if (only == "sparse") break;
    const std::size_t n = bytes / sizeof(float);
    std::vector<std::size_t> tensors;
    for (int k = 0; k < depth; ++k) tensors.push_back(w.add_dense(n));
    std::vector<float> grad(n);
    for (std::size_t i = 0; i < n; ++i) grad[i] = gradient(i);
    std::vector<std::vector<float>> values(tensors.size(), std::vector<float>(n));
    std::vector<worker_t::request> round(tensors.size());
    long pushed = 0;  // by this worker, to each of `tensors`
    for (const char* what : {"push", "pull", "push+pull"}) {
      const std::string op = what;
      const double s = dtrain::bench::time_per_call([&] {
        pushed += op != "pull";
        for (std::size_t k = 0; k < tensors.size(); ++k) {
          round[k] = op == "push"   ? w.push_dense(tensors[k], grad)
                     : op == "pull" ? w.pull_dense(tensors[k], values[k])
                                    : w.push_pull_dense(tensors[k], grad, values[k]);
        }
        for (auto& q : round) w.wait(q);
      }, seconds, 3) / static_cast<double>(depth);
      const double moved = static_cast<double>(bytes) * (op == "push+pull" ? 2 : 1) * r.workers;
      results.push_back({"dense " + op, bytes, 0, s, moved / s / 1e9, 0});
    }
    for (std::size_t k = 0; k < tensors.size(); ++k) {  // into NaN, so a pull that wrote nothing shows
      std::fill(values[k].begin(), values[k].end(), std::nanf(""));
      w.wait(round[k] = w.pull_dense(tensors[k], values[k]));
      results.back().wrong += wrong_values(values[k], {}, pushed, unjudged);  // after the size's three rows
    }
  }
  const long once = wrong_exactly_once(w, r.workers, only != "sparse", only != "dense");
  std::mt19937_64 gen(static_cast<std::uint64_t>(w.id()) + 7);
  if (only == "dense") sparse_keys = 0;
  std::vector<key_type> keys(sparse_keys);
  for (auto& k : keys) k = 2 * (gen() % (std::uint64_t{1} << 23)) + 1;  // odd: apart from the exactly-once keys
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  std::vector<float> grad(keys.size()), values(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) grad[i] = gradient(keys[i]);
  long pushed = 0;
  const double s = keys.empty() ? 1.0 : dtrain::bench::time_per_call([&] {
    auto q = w.push_pull(keys, std::span<const float>(grad), std::span(values), 1);
    w.wait(q);
    ++pushed;
  }, seconds, 3);
  if (!keys.empty()) {  // once more, into NaN, so a reply that wrote nothing shows
    std::fill(values.begin(), values.end(), std::nanf(""));
    auto q = w.push_pull(keys, std::span<const float>(grad), std::span(values), 1);
    w.wait(q);
    ++pushed;
    results.push_back({"sparse push+pull", keys.size() * sizeof(float), keys.size(), s,
                       2.0 * static_cast<double>(keys.size() * sizeof(float)) * r.workers / s / 1e9,
                       static_cast<double>(keys.size()) * r.workers / s / 1e6,
                       wrong_values(values, keys, pushed, unjudged)});
  }
  long wrong = once;
  for (const result& x : results) wrong += x.wrong;
  if (wrong != 0) fmt::print(stderr, "bench_ps: worker {} pulled {} wrong values\n", w.id(), wrong);
  if (once != 0) fmt::print(stderr, "bench_ps: worker {}: {} values not exactly its 3 pushes\n", w.id(), once);
  w.finish();
  if (w.id() == 0) {
    fmt::print(
        "# dtrain bench_ps: {} server(s), {} worker(s), TCP, ASP, SGD on the servers, {} dense tensor(s) in flight, "
        "{} KiB slices, {} posted receives, {} replica(s)\n",
        r.servers, r.workers, depth, slice_kib, posted, replicas);
    if (r.workers <= 6) fmt::print("# exactly once: {} wrong values of worker 0\n", once);
    fmt::print("# values of worker 0 past float's exact range, not judged: {}\n", unjudged);
    fmt::print("# {:<18} {:>12} {:>10} {:>12} {:>10} {:>10} {:>7}\n", "op", "size(B)", "keys", "time(us)", "GB/s",
               "Mkeys/s", "#wrong");
    std::string out = "[\n";
    for (std::size_t i = 0; i < results.size(); ++i) {
      const auto& x = results[i];
      fmt::print("  {:<18} {:>12} {:>10} {:>12.1f} {:>10.3f} {:>10.2f} {:>7}\n", x.what, x.bytes, x.keys,
                 x.seconds * 1e6, x.gbps, x.mkeys, x.wrong);
      out += fmt::format("  {{\"op\": \"{}\", \"servers\": {}, \"workers\": {}, \"bytes\": {}, \"keys\": {}, "
                         "\"time_us\": {:.2f}, \"GBps\": {:.4f}, \"Mkeys_per_s\": {:.3f}, \"wrong\": {}}}{}\n",
                         x.what, r.servers, r.workers, x.bytes, x.keys, x.seconds * 1e6, x.gbps, x.mkeys, x.wrong,
                         i + 1 < results.size() ? "," : "");
    }
    bench::write_file(json, out + "]\n");
  }
  return wrong == 0 ? 0 : 1;
}
