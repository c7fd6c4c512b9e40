// Every worker algorithm against a serial single-process simulation of its equations: exact
// (bit for bit) where the run is deterministic (BSP, or one worker under ASP), convergence where
// asynchrony makes the order vary.

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <unistd.h>
#include <functional>
#include <mutex>
#include <random>
#include <vector>

#include "../catch.hpp"
#include "dtrain/consistency/policies.hpp"
#include "dtrain/ps/algorithms.hpp"
#include "dtrain/ps/hogwild.hpp"
#include "dtrain/ps/trainer.hpp"
#include "dtrain/ps/server.hpp"
#include "dtrain/ps/worker.hpp"
#include "dtrain/transport/inproc.hpp"
#include "dtrain/updater/adagrad.hpp"
#include "dtrain/updater/delta.hpp"
#include "dtrain/updater/momentum.hpp"
#include "dtrain/updater/sgd.hpp"
#include "dtrain/updater/staleness_aware.hpp"
#include "problem.hpp"

using namespace dtrain;
using namespace dtrain::ps;
using namespace std::chrono_literals;

namespace {

using dtrain::testing::dim;
using dtrain::testing::problem;

struct outcome {
  std::vector<std::vector<float>> replicas;  // each worker's x at the end
  std::vector<float> center;                 // x~ at the end
  server_stats server;
};

ps_options quick_options() {
  ps_options o;
  o.timeout = 30s;
  o.heartbeat_interval = 100ms;
  return o;
}

// Runs `steps` iterations of the algorithm made by `make` on `workers` worker threads, one
// server with updater `u`, under consistency C.
template <class C, class U, class Make>
outcome run(int workers, int steps, U u, Make make) {
  outcome out;
  out.replicas.resize(static_cast<std::size_t>(workers));
  const roles r = roles::of(1 + workers, 1);
  run_inproc(1 + workers, [&](int rank, inproc_transport t) {
    if (rank == 0) {
      using algorithm = decltype(make());
      server<inproc_transport, C, float, U> s(std::move(t), r, C{}, u, {}, quick_options(), algorithm::server_mode);
      s.run();
      out.server = s.stats();
      return;
    }
    worker<inproc_transport, C, float> w(std::move(t), r, range_sharding(1), quick_options());
    problem p(w.id());
    auto algo = make();
    std::vector<float> x(dim);
    algo.begin(w, std::span(x));
    for (int it = 0; it < steps; ++it) {
      algo.step(w, std::span(x), [&](auto xs, auto g, std::int64_t tt) { p.grad(xs, g, tt); }, it);
    }
    algo.end(w, std::span(x));
    auto final_clock = w.clock();
    w.wait(final_clock);
    std::vector<float> center(dim);
    if constexpr (requires { algo.read_center(w, std::span(center)); }) {
      algo.read_center(w, std::span(center));  // a model kept in the sparse table
    } else {
      auto pulled = w.pull_dense(0, std::span(center));
      w.wait(pulled);
    }
    out.replicas[static_cast<std::size_t>(w.id())] = x;
    if (w.id() == 0) out.center = center;
  });
  return out;
}

std::vector<problem> problems(int workers) {
  std::vector<problem> ps;
  for (int w = 0; w < workers; ++w) ps.emplace_back(w);
  return ps;
}

// The server's combination of one round: sum in worker order from zero, then scale.
std::vector<float> combine(const std::vector<std::vector<float>>& pushes, float scale) {
  std::vector<float> acc(dim, 0.0f);
  for (const auto& p : pushes)
    for (std::size_t j = 0; j < dim; ++j) acc[j] += p[j];
  for (float& v : acc) v *= scale;
  return acc;
}

}  // namespace

TEST_CASE("synchronous SGD under BSP equals serial SGD on the mean gradient", "[ps][algorithms]") {
  constexpr int W = 3, steps = 20;
  const float lr = 0.05f;
  auto got = run<bsp>(W, steps, sgd<float>(lr), [] { return sync_sgd<float>(); });
  auto ps_ = problems(W);
  std::vector<float> center(dim, 0.0f);
  std::vector<std::vector<float>> g(W, std::vector<float>(dim));
  for (int t = 0; t < steps; ++t) {
    for (int w = 0; w < W; ++w) ps_[static_cast<std::size_t>(w)].grad(center, g[static_cast<std::size_t>(w)], t);
    const auto mean = combine(g, 1.0f / W);
    for (std::size_t j = 0; j < dim; ++j) center[j] -= lr * mean[j];
  }
  CHECK(got.center == center);
  for (const auto& x : got.replicas) CHECK(x == center);
  CHECK(got.server.staleness_histogram[0] == static_cast<std::uint64_t>(W * steps));  // never stale
}

TEST_CASE("top-k SGD under BSP equals serial top-k with error feedback, and converges like dense", "[ps][algorithms]") {
  constexpr int W = 3, steps = 60;
  const float lr = 0.05f;
  for (double density : {0.25, 0.5}) {
    INFO("density " << density);
    auto got = run<bsp>(W, steps, sgd<float>(lr), [=] { return topk_sgd<float>(density); });
    // Serially: each worker sends its k largest of gradient + residual, keeps the rest; the
    // server sums the round in worker order (unsent entries count as zero), scales by 1/W, steps.
    auto ps_ = problems(W);
    const std::size_t k = topk_count(dim, density);
    std::vector<float> center(dim, 0.0f);
    std::vector<std::vector<float>> g(W, std::vector<float>(dim)), residual(W, std::vector<float>(dim, 0.0f));
    for (int t = 0; t < steps; ++t) {
      std::vector<std::vector<float>> sent(W, std::vector<float>(dim, 0.0f));
      for (std::size_t w = 0; w < W; ++w) {
        ps_[w].grad(center, g[w], t);
        for (std::size_t j = 0; j < dim; ++j) residual[w][j] += g[w][j];
        std::vector<std::size_t> order(dim);
        for (std::size_t j = 0; j < dim; ++j) order[j] = j;
        std::partial_sort(
            order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
            [&](std::size_t a, std::size_t b) { return std::fabs(residual[w][a]) > std::fabs(residual[w][b]); });
        for (std::size_t i = 0; i < k; ++i) sent[w][order[i]] = residual[w][order[i]], residual[w][order[i]] = 0.0f;
      }
      const auto mean = combine(sent, 1.0f / W);
      for (std::size_t j = 0; j < dim; ++j) center[j] -= lr * mean[j];
    }
    CHECK(got.center == center);
    for (const auto& x : got.replicas) CHECK(x == center);
    // And it ends near where dense synchronous SGD does.
    auto dense = run<bsp>(W, steps, sgd<float>(lr), [] { return sync_sgd<float>(); });
    const problem p0(0);
    CHECK(p0.loss(got.center) < 1.5f * p0.loss(dense.center) + 0.01f);
  }
}

TEST_CASE("Downpour: accumulated gradients every n_push, fetches every n_fetch, Adagrad on the server",
          "[ps][algorithms]") {
  constexpr int W = 3, steps = 24, n_push = 2, n_fetch = 3;
  const float lr = 0.2f;
  auto got = run<bsp>(W, steps, adagrad<float>(lr), [] { return downpour<float>(n_push, n_fetch); });
  auto ps_ = problems(W);
  std::vector<float> center(dim, 0.0f), G(dim, 0.0f);
  std::vector<std::vector<float>> x(W, std::vector<float>(dim, 0.0f)), acc(W, std::vector<float>(dim, 0.0f));
  std::vector<float> g(dim);
  for (int t = 0; t < steps; ++t) {
    for (std::size_t w = 0; w < W; ++w) {
      ps_[w].grad(x[w], g, t);
      for (std::size_t j = 0; j < dim; ++j) acc[w][j] += g[j];
    }
    if ((t + 1) % n_push == 0) {
      const auto mean = combine(acc, 1.0f / W);
      for (std::size_t j = 0; j < dim; ++j) {  // Adagrad, as dtrain::adagrad writes it
        G[j] += mean[j] * mean[j];
        center[j] -= lr * mean[j] / (std::sqrt(G[j]) + 1e-10f);
      }
      for (auto& a : acc) std::fill(a.begin(), a.end(), 0.0f);
    }
    if ((t + 1) % n_fetch == 0) {
      for (auto& xw : x) xw = center;
    }
  }
  CHECK(got.center == center);
  for (std::size_t w = 0; w < W; ++w) CHECK(got.replicas[w] == x[w]);
}

TEST_CASE("ADAG: local steps, then (x - x_last_sync) / window added to the center", "[ps][algorithms]") {
  constexpr int W = 2, steps = 18, window = 4;
  const float eta = 0.05f;
  auto got = run<bsp>(W, steps, delta<float>(), [&] { return adag<float>(eta, window); });
  auto ps_ = problems(W);
  std::vector<float> center(dim, 0.0f), g(dim);
  std::vector<std::vector<float>> x(W, center), last(W, center), d(W, std::vector<float>(dim));
  for (int t = 0; t < steps; ++t) {
    for (std::size_t w = 0; w < W; ++w) {
      ps_[w].grad(x[w], g, t);
      for (std::size_t j = 0; j < dim; ++j) x[w][j] -= eta * g[j];
    }
    if ((t + 1) % window == 0) {
      for (std::size_t w = 0; w < W; ++w)
        for (std::size_t j = 0; j < dim; ++j) d[w][j] = (x[w][j] - last[w][j]) * (1.0f / window);
      const auto sum = combine(d, 1.0f);
      for (std::size_t j = 0; j < dim; ++j) center[j] += 1.0f * sum[j];
      for (std::size_t w = 0; w < W; ++w) x[w] = last[w] = center;
    }
  }
  CHECK(got.center == center);
  for (std::size_t w = 0; w < W; ++w) CHECK(got.replicas[w] == x[w]);
}

TEST_CASE("EASGD synchronous: elastic pull toward the center every tau, center moves by the sum",
          "[ps][algorithms]") {
  constexpr int W = 3, steps = 15, tau = 3;
  const float eta = 0.05f, rho = 2.0f;
  const float alpha = static_cast<float>(0.05 * 2.0);
  auto got = run<bsp>(W, steps, delta<float>(),
                      [&] { return easgd<float>(eta, rho, tau, easgd<float>::mode::synchronous); });
  auto ps_ = problems(W);
  std::vector<float> center(dim, 0.0f), g(dim);
  std::vector<std::vector<float>> x(W, center), e(W, std::vector<float>(dim));
  for (int t = 0; t < steps; ++t) {
    const bool elastic = t % tau == 0;
    for (std::size_t w = 0; w < W; ++w) {
      if (elastic)
        for (std::size_t j = 0; j < dim; ++j) e[w][j] = alpha * (x[w][j] - center[j]);
      ps_[w].grad(x[w], g, t);
      for (std::size_t j = 0; j < dim; ++j) x[w][j] = x[w][j] - eta * g[j] - (elastic ? e[w][j] : 0.0f);
    }
    if (elastic) {
      const auto sum = combine(e, 1.0f);
      for (std::size_t j = 0; j < dim; ++j) center[j] += 1.0f * sum[j];
    }
  }
  CHECK(got.center == center);
  for (std::size_t w = 0; w < W; ++w) CHECK(got.replicas[w] == x[w]);
}

TEST_CASE("EASGD asynchronous (Algorithm 1): one worker exactly, several converge", "[ps][algorithms]") {
  constexpr int steps = 20, tau = 4;
  const float eta = 0.05f, rho = 3.0f;
  const float alpha = static_cast<float>(0.05 * 3.0);
  auto make = [&] { return easgd<float>(eta, rho, tau, easgd<float>::mode::asynchronous); };
  auto one = run<asp>(1, steps, delta<float>(), make);
  problem p(0);
  std::vector<float> center(dim, 0.0f), x(dim, 0.0f), g(dim), e(dim);
  for (int t = 0; t < steps; ++t) {
    if (t % tau == 0) {
      for (std::size_t j = 0; j < dim; ++j) e[j] = alpha * (x[j] - center[j]);
      for (std::size_t j = 0; j < dim; ++j) x[j] -= e[j];
      for (std::size_t j = 0; j < dim; ++j) center[j] += 1.0f * e[j];
    }
    p.grad(x, g, t);
    for (std::size_t j = 0; j < dim; ++j) x[j] -= eta * g[j];
  }
  CHECK(one.center == center);
  CHECK(one.replicas[0] == x);
  auto many = run<asp>(3, 150, delta<float>(), make);
  for (int w = 0; w < 3; ++w) CHECK(problem(w).loss(many.replicas[static_cast<std::size_t>(w)]) < 0.05f);
}

TEST_CASE("model averaging: every period the center becomes the mean of the replicas", "[ps][algorithms]") {
  constexpr int W = 3, steps = 12, period = 4;
  const float eta = 0.05f;
  auto got = run<bsp>(W, steps, delta<float>(), [&] { return model_averaging<float>(eta, period); });
  auto ps_ = problems(W);
  std::vector<float> center(dim, 0.0f), g(dim);
  std::vector<std::vector<float>> x(W, center), d(W, std::vector<float>(dim));
  for (int t = 0; t < steps; ++t) {
    for (std::size_t w = 0; w < W; ++w) {
      ps_[w].grad(x[w], g, t);
      for (std::size_t j = 0; j < dim; ++j) x[w][j] -= eta * g[j];
    }
    if ((t + 1) % period == 0) {
      for (std::size_t w = 0; w < W; ++w)
        for (std::size_t j = 0; j < dim; ++j) d[w][j] = (x[w][j] - center[j]) * (1.0f / W);
      const auto sum = combine(d, 1.0f);
      for (std::size_t j = 0; j < dim; ++j) center[j] += 1.0f * sum[j];
      for (auto& xw : x) xw = center;
    }
  }
  CHECK(got.center == center);
  // The mean of the replicas, up to float rounding of the delta form.
  for (std::size_t w = 0; w < W; ++w) CHECK(got.replicas[w] == x[w]);
}

TEST_CASE("DynSGD: each change divided by its staleness plus one", "[ps][algorithms]") {
  constexpr int steps = 12, window = 2;
  const float eta = 0.05f;
  using server_updater = staleness_aware<delta<float>, 1>;
  auto one = run<asp>(1, steps, server_updater(delta<float>()), [&] { return dynsgd<float>(eta, window); });
  problem p(0);
  std::vector<float> center(dim, 0.0f), x(dim, 0.0f), g(dim), pulled(dim, 0.0f);
  for (int t = 0; t < steps; ++t) {
    p.grad(x, g, t);
    for (std::size_t j = 0; j < dim; ++j) x[j] -= eta * g[j];
    if ((t + 1) % window == 0) {
      for (std::size_t j = 0; j < dim; ++j) center[j] += 1.0f * (x[j] - pulled[j]);  // staleness 0: / 1
      x = pulled = center;
    }
  }
  CHECK(one.center == center);
  CHECK(one.server.staleness_histogram[0] == steps / window);
  // Several workers: updates do go stale, are damped, and the model still converges.
  auto many = run<asp>(4, 120, server_updater(delta<float>()), [&] { return dynsgd<float>(eta, window); });
  std::uint64_t stale = 0;
  for (std::size_t s = 1; s < many.server.staleness_histogram.size(); ++s) stale += many.server.staleness_histogram[s];
  CHECK(stale > 0);
  CHECK(problem(0).loss(many.center) < 0.05f);
  // Per-worker histograms add up to the server's.
  REQUIRE(many.server.per_worker_staleness.size() == 4);
  for (std::size_t s = 0; s < many.server.staleness_histogram.size(); ++s) {
    std::uint64_t sum = 0;
    for (const auto& h : many.server.per_worker_staleness) sum += h[s];
    CHECK(sum == many.server.staleness_histogram[s]);
  }
  CHECK(many.server.mean_staleness() > 0);
}

TEST_CASE("Hogwild: threads on disjoint coordinates equal the serial run, overlapping ones converge",
          "[ps][algorithms]") {
  // Sparse least squares: sample s touches coordinates s % 64 and (s * 7 + 1) % 64.
  constexpr std::size_t n = 64, samples_total = 4096;
  auto touched = [](std::size_t s) { return std::pair<std::size_t, std::size_t>(s % n, (s * 7 + 1) % n); };
  auto target = [](std::size_t j) { return 0.01f * static_cast<float>(j) - 0.3f; };
  const float lr = 0.1f;
  auto sgd_step = [&](std::size_t s, auto load, auto add) {
    const auto [a, b] = touched(s);
    const float err = load(a) + load(b) - (target(a) + target(b));
    add(a, -lr * err);
    if (b != a) add(b, -lr * err);
  };
  // Disjoint: single-coordinate samples, thread t owning the coordinates j = t (mod 4); each
  // coordinate then sees exactly the serial sequence of updates.
  std::vector<float> serial(n, 0.0f), parallel(n, 0.0f);
  auto single = [&](std::size_t s, auto load, auto add) {
    const std::size_t a = s % n;
    add(a, -lr * (load(a) - target(a)));
  };
  for (std::size_t s = 0; s < samples_total; ++s) {
    single(s, [&](std::size_t i) { return serial[i]; }, [&](std::size_t i, float d) { serial[i] += d; });
  }
  run_hogwild(std::span(parallel), 4, [&](int t, auto shared) {
    for (std::size_t s = 0; s < samples_total; ++s) {
      if (static_cast<int>((s % n) % 4) != t) continue;  // coordinates j = t (mod 4) only
      single(s, [&](std::size_t i) { return shared.load(i); }, [&](std::size_t i, float d) { shared.add(i, d); });
    }
  });
  CHECK(parallel == serial);
  // Overlapping: every thread runs every sample in its own order; collisions happen, and the
  // solution is still reached.
  std::vector<float> racing(n, 0.0f);
  run_hogwild(std::span(racing), 4, [&](int t, auto shared) {
    for (std::size_t k = 0; k < samples_total; ++k) {
      const std::size_t s = (k * 13 + static_cast<std::size_t>(t) * 101) % samples_total;
      sgd_step(s, [&](std::size_t i) { return shared.load(i); }, [&](std::size_t i, float d) { shared.add(i, d); });
    }
  });
  float worst = 0;
  for (std::size_t j = 0; j < n; ++j) worst = std::max(worst, std::fabs(racing[j] - target(j)));
  CHECK(worst < 0.05f);
}

TEST_CASE("checkpoint and resume under BSP: the resumed job ends bit for bit like the uninterrupted one",
          "[ps][checkpoint]") {
  // Momentum on the servers (state that must survive), the model sliced over two servers.
  constexpr int W = 2, steps = 20, crash_after = 11, every = 4;
  const std::string prefix = "/tmp/dtrain_resume_" + std::to_string(::getpid());
  auto job = [&](int first, int last, ps_options o) {
    std::vector<float> center(dim);
    const roles r = roles::of(2 + W, 2);
    run_inproc(2 + W, [&](int, inproc_transport t) {
      trainer<inproc_transport, bsp, momentum<float>, sync_sgd<float>> tr(std::move(t), momentum<float>(0.05, 0.9),
                                                                         sync_sgd<float>(), r, o);
      if (tr.is_server()) {
        tr.serve();
        return;
      }
      problem p(tr.worker_endpoint().id());
      std::vector<float> x(dim);
      tr.begin(std::span(x));
      if (tr.first_step() != first) throw std::runtime_error("resumed at the wrong step");
      for (int it = first; it < last; ++it) {
        tr.step(std::span(x), [&](auto xs, auto g, std::int64_t tt) { p.grad(xs, g, tt); }, it);
      }
      if (last == steps) {
        tr.end(std::span(x));
        if (tr.worker_endpoint().id() == 0) center = x;
      } else {
        tr.worker_endpoint().finish();  // the job stops here, as if a process had died
      }
    });
    return center;
  };
  ps_options o = quick_options();
  o.dense_slice_bytes = 16;  // 3 slices over 2 servers
  const auto uninterrupted = job(0, steps, o);
  o.checkpoint_prefix = prefix;
  o.checkpoint_every = every;
  job(0, crash_after, o);  // checkpoints at clocks 4 and 8; dies at 11
  o.resume = true;
  const auto resumed = job(8, steps, o);
  CHECK(resumed == uninterrupted);
  CHECK(latest_common_checkpoint(prefix, 2) == std::optional<std::int64_t>(20));  // the resumed job wrote on
  for (int s = 0; s < 2; ++s) {
    for (int c : {4, 8, 12, 16, 20}) {
      for (const char* which : {"sparse", "dense"}) std::remove(checkpoint_file(prefix, s, c, which).c_str());
    }
  }
}
