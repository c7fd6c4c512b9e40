// Click-through prediction with dtrain's parameter server: sparse logistic regression on hashed
// features (a 2^24 key space, power-law frequencies), FTRL-proximal on the servers, workers
// pulling and pushing only the keys of each batch. The data comes from a known true model (or a
// libsvm file), so the trained model's test logloss can be compared with the truth's.
//
//   DTRAIN_PS_SERVERS=2 dtrain-run -n 4 ./ctr                  # 2 servers, 2 workers
//   DTRAIN_PS_SERVERS=2 dtrain-run -n 6 ./ctr --consistency ssp4
//   DTRAIN_PS_SERVERS=1 dtrain-run -n 3 ./ctr --train a.libsvm --test b.libsvm
//
// The first DTRAIN_PS_SERVERS ranks serve; the others are workers. Worker 0 prints progress and
// the evaluation; each server prints what it did (updates, keys and bytes moved, staleness).

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <dtrain/consistency/policies.hpp>
#include <dtrain/ps/server.hpp>
#include <dtrain/ps/worker.hpp>
#include <dtrain/transport/tcp.hpp>
#include <dtrain/updater/ftrl.hpp>

#include "data.hpp"

namespace {

struct settings {
  std::string consistency = "asp";
  int epochs = 3, features = 20, batch = 512, log_every = 100;
  std::size_t samples = 200000, test_samples = 20000;
  double alpha = 0.1, beta = 1.0, l1 = 0.01, l2 = 0.1;
  std::string train, test;
  double max_gap = 0;  // fail (exit 3) when the logloss is more than this fraction above the truth's
};

using clock_type = std::chrono::steady_clock;
constexpr std::uint64_t bias_key = ctr::key_space;  // one past the hashed features

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

double logloss(double p, float y) {
  p = std::clamp(p, 1e-12, 1.0 - 1e-12);
  return y > 0.5f ? -std::log(p) : -std::log(1.0 - p);
}

template <class Worker>
std::vector<double> predict(Worker& w, const std::vector<ctr::sample>& data) {
  std::vector<std::uint64_t> keys{bias_key};
  for (const auto& s : data) keys.insert(keys.end(), s.features.begin(), s.features.end());
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  std::vector<float> weights(keys.size());
  auto r = w.pull(keys, std::span(weights), 1);
  w.wait(r);
  auto weight = [&](std::uint64_t k) { return weights[std::lower_bound(keys.begin(), keys.end(), k) - keys.begin()]; };
  std::vector<double> p;
  const double b = weight(bias_key);
  for (const auto& s : data) {
    double z = b;
    for (auto k : s.features) z += weight(k);
    p.push_back(sigmoid(z));
  }
  return p;
}

template <class Consistency>
int run(const settings& s) {
  dtrain::tcp_options to;
  to.abort_group_on_peer_loss = false;  // the servers decide what a lost worker means
  auto t = dtrain::tcp_transport::from_environment(to);
  const auto roles = dtrain::ps::roles::from_environment(t.size());
  dtrain::ps::ps_options o;
  if (roles.is_server(t.rank())) {
    dtrain::ps::server<dtrain::tcp_transport, Consistency, float, dtrain::ftrl<float>> server(
        std::move(t), roles, Consistency{}, dtrain::ftrl<float>(s.alpha, s.beta, s.l1, s.l2), {}, o);
    const int me = server.shard();
    server.run();
    const auto& st = server.stats();
    // A standby holds only the shards it joined; a server that took over others holds those too.
    const bool growing = server.standby() && me - roles.standby_rank(0) < roles.growing;
    const char* role = growing ? " (added capacity)" : server.standby() ? " (standby)" : "";
    const std::vector<int> held = server.held_shards();
    std::size_t keys = 0;
    for (int shard : held) keys += server.shard_tables(shard).sparse().size();
    fmt::print("server {}{}: {} keys held in {} shard(s), {} updates applied as a head, {} keys pushed, "
               "{} keys pulled, {:.1f} MB in, {:.1f} MB out, longest wait queue {}, mean staleness {:.2f}\n",
               me, role, keys, held.size(), st.head_updates, st.keys_pushed,
               st.keys_pulled, static_cast<double>(st.bytes_in) / 1e6,
               static_cast<double>(st.bytes_out) / 1e6, st.max_deferred, st.mean_staleness());
    for (std::size_t w = 0; w < st.per_worker_staleness.size(); ++w) {
      std::string hist;
      for (std::size_t b = 0; b < 8; ++b) hist += fmt::format(" {}:{}", b, st.per_worker_staleness[w][b]);
      fmt::print("server {}: worker {} staleness histogram{} ...\n", me, w, hist);
    }
    return 0;
  }
  dtrain::ps::worker<dtrain::tcp_transport, Consistency, float> w(
      std::move(t), roles, dtrain::ps::range_sharding(roles.shard_count(), ctr::key_space + 1), o);
  const ctr::true_model truth;
  std::vector<ctr::sample> train, test;
  std::vector<double> true_p;
  if (!s.train.empty()) {
    train = ctr::read_libsvm(s.train, w.id(), roles.workers);
    if (w.id() == 0) test = ctr::read_libsvm(s.test.empty() ? s.train : s.test, 0, 1);
  } else {
    ctr::generator gen(1000 + static_cast<std::uint64_t>(w.id()), s.features);
    for (std::size_t i = 0; i < s.samples; ++i) train.push_back(gen.next(truth));
    if (w.id() == 0) {
      ctr::generator test_gen(7, s.features);
      for (std::size_t i = 0; i < s.test_samples; ++i) {
        double logit = 0;
        test.push_back(test_gen.next(truth, &logit));
        true_p.push_back(sigmoid(logit));
      }
    }
  }
  if (w.id() == 0) {
    fmt::print("ctr: {} servers, {} workers, {}, FTRL(alpha {}, beta {}, l1 {}, l2 {}), {} samples per worker, "
               "batch {}\n", roles.servers, roles.workers, Consistency::name, s.alpha, s.beta, s.l1, s.l2,
               train.size(), s.batch);
  }
  const std::size_t batches = train.size() / static_cast<std::size_t>(s.batch);
  auto evaluate = [&](int epoch) {
    if (w.id() != 0) return 0.0;
    const auto p = predict(w, test);
    double loss = 0, true_loss = 0;
    std::vector<float> labels;
    for (std::size_t i = 0; i < test.size(); ++i) {
      loss += logloss(p[i], test[i].label) / static_cast<double>(test.size());
      labels.push_back(test[i].label);
      if (!true_p.empty()) true_loss += logloss(true_p[i], test[i].label) / static_cast<double>(test.size());
    }
    if (true_p.empty()) {
      fmt::print("epoch {}: test logloss {:.4f}, AUC {:.4f}\n", epoch, loss, ctr::auc(p, labels));
      return 0.0;
    }
    const double gap = loss / true_loss - 1.0;
    fmt::print("epoch {}: test logloss {:.4f} (true model {:.4f}, {:+.1f}%), AUC {:.4f} (true model {:.4f})\n", epoch,
               loss, true_loss, 100 * gap, ctr::auc(p, labels), ctr::auc(true_p, labels));
    return gap;
  };

  std::vector<std::uint64_t> keys;
  std::vector<float> weights, grads;
  double gap = 0;
  for (int epoch = 1; epoch <= s.epochs; ++epoch) {
    const auto start = clock_type::now();
    double window_loss = 0;
    for (std::size_t b = 0; b < batches; ++b) {
      const auto first = train.begin() + static_cast<std::ptrdiff_t>(b * static_cast<std::size_t>(s.batch));
      const auto last = first + s.batch;
      keys.assign(1, bias_key);
      for (auto it = first; it != last; ++it) keys.insert(keys.end(), it->features.begin(), it->features.end());
      std::sort(keys.begin(), keys.end());
      keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
      weights.resize(keys.size());
      auto pulled = w.pull(keys, std::span(weights), 1);
      w.wait(pulled);
      grads.assign(keys.size(), 0.0f);
      auto index = [&](std::uint64_t k) {
        return static_cast<std::size_t>(std::lower_bound(keys.begin(), keys.end(), k) - keys.begin());
      };
      const std::size_t bias = index(bias_key);
      for (auto it = first; it != last; ++it) {
        double z = weights[bias];
        for (auto k : it->features) z += weights[index(k)];
        const double p = sigmoid(z);
        window_loss += logloss(p, it->label);
        // Summed, not averaged, over the batch: FTRL's per-coordinate rates expect each sample's
        // gradient, as in online learning; a feature seen once in a batch of 512 would
        // otherwise move 512 times too little.
        const auto g = static_cast<float>(p - it->label);
        grads[bias] += g;
        for (auto k : it->features) grads[index(k)] += g;
      }
      auto pushed = w.push(keys, std::span<const float>(grads), 1);
      auto clocked = w.clock();
      w.wait(pushed);
      w.wait(clocked);
      if (w.id() == 0 && s.log_every > 0 && (b + 1) % static_cast<std::size_t>(s.log_every) == 0) {
        const double secs = std::chrono::duration<double>(clock_type::now() - start).count();
        fmt::print("epoch {} batch {:>5}/{}  train logloss {:.4f}  {:.0f} samples/s per worker\n", epoch, b + 1,
                   batches, window_loss / (s.log_every * s.batch), static_cast<double>((b + 1) * s.batch) / secs);
        window_loss = 0;
      }
    }
    gap = evaluate(epoch);
  }
  const auto& st = w.stats();
  if (w.id() == 0) {
    fmt::print(
        "worker 0: {} pushes, {} pulls, {} keys pushed, {} keys pulled, {:.1f} MB out, {:.1f} MB in, "
        "{:.1f} s waiting\n",
        st.pushes, st.pulls, st.keys_pushed, st.keys_pulled, static_cast<double>(st.bytes_out) / 1e6,
        static_cast<double>(st.bytes_in) / 1e6, st.wait_seconds);
  }
  w.finish();
  // Written so that a NaN gap fails too.
  return s.max_gap > 0 && !(gap <= s.max_gap) ? 3 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  settings s;
  CLI::App app{"Sparse logistic regression (click-through) on dtrain's parameter server (launch with dtrain-run)"};
  app.add_option("--consistency", s.consistency, "consistency model")
      ->check(CLI::IsMember({"bsp", "asp", "ssp1", "ssp4", "soft2"}))->capture_default_str();
  app.add_option("--epochs", s.epochs)->capture_default_str();
  app.add_option("--samples", s.samples, "synthetic training samples per worker")->capture_default_str();
  app.add_option("--test-samples", s.test_samples)->capture_default_str();
  app.add_option("--features", s.features, "features per synthetic sample")->capture_default_str();
  app.add_option("--batch", s.batch, "samples per worker per step")->capture_default_str();
  app.add_option("--alpha", s.alpha, "FTRL learning rate")->capture_default_str();
  app.add_option("--beta", s.beta)->capture_default_str();
  app.add_option("--l1", s.l1)->capture_default_str();
  app.add_option("--l2", s.l2)->capture_default_str();
  app.add_option("--train", s.train, "a libsvm file instead of synthetic data");
  app.add_option("--test", s.test, "a libsvm test file (default: the training file)");
  app.add_option("--log-every", s.log_every)->capture_default_str();
  app.add_option("--max-gap", s.max_gap, "exit 3 if the test logloss exceeds the true model's by this fraction");
  CLI11_PARSE(app, argc, argv);
  try {
    if (s.consistency == "bsp") return run<dtrain::bsp>(s);
    if (s.consistency == "ssp1") return run<dtrain::ssp<1>>(s);
    if (s.consistency == "ssp4") return run<dtrain::ssp<4>>(s);
    if (s.consistency == "soft2") return run<dtrain::soft_sync<2>>(s);
    return run<dtrain::asp>(s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ctr: %s\n", e.what());
    return 1;
  }
}
