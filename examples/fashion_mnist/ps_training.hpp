#pragma once
// The Fashion-MNIST example with the parameter-server trainer (--trainer ps): the MLP's flat
// parameters one dense tensor on the servers, each worker running the chosen algorithm under the
// chosen consistency model on its shard of the data.

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/core.h>

#include <dtrain/consistency/policies.hpp>
#include <dtrain/data/sampler.hpp>
#include <dtrain/ps/trainer.hpp>
#include <dtrain/transport/mixed.hpp>
#include <dtrain/updater/adagrad.hpp>
#include <dtrain/updater/delta.hpp>
#include <dtrain/updater/momentum.hpp>
#include <dtrain/updater/staleness_aware.hpp>

#include "dataset.hpp"
#include "mlp.hpp"
#include "settings.hpp"

namespace example {

// Trains with ps::trainer<mixed_transport, Consistency, Updater, Algorithm>: the MLP's flat
// parameters are one dense tensor on the servers; each worker runs the algorithm on its shard.
template <class Consistency, class Updater, class Algorithm>
int run_ps_with(const settings& s, dtrain::mixed_transport transport, Updater updater, Algorithm algorithm) {
  const auto roles = dtrain::ps::roles::from_environment(transport.size());
  const auto P = static_cast<std::size_t>(roles.workers);
  if (s.global_batch % P != 0) {
    throw dtrain::error(dtrain::errc::invalid_argument,
                        fmt::format("--batch {} does not split evenly across {} workers", s.global_batch, P));
  }
  dtrain::ps::ps_options o;
  o.replicas = s.replicas;
  o.dense_slice_bytes = s.slice_kib * 1024;
  // The servers create the parameters: uniform in +-0.05, near PyTorch's +-1/sqrt(fan_in) for
  // these layers (0.036 to 0.088), and the same on every run.
  dtrain::ps::trainer<dtrain::mixed_transport, Consistency, Updater, Algorithm, float, dtrain::ps::uniform_initializer>
      job(std::move(transport), std::move(updater), std::move(algorithm), roles, o,
          dtrain::ps::uniform_initializer{0.05, s.seed});
  if (job.is_server()) {
    const auto& st = job.serve();
    fmt::print(
        "server: {} updates applied as a head, {} pushes, {} pulls, {:.1f} MB in, {:.1f} MB out, "
        "longest wait queue {}, mean staleness {:.2f}\n",
        st.head_updates, st.pushes, st.pulls, static_cast<double>(st.bytes_in) / 1e6,
        static_cast<double>(st.bytes_out) / 1e6, st.max_deferred, st.mean_staleness());
    return 0;
  }
  auto& w = job.worker_endpoint();
  const int me = w.id();
  const auto train = fashion_mnist::load(s.data, "train");
  const auto test = fashion_mnist::load(s.data, "t10k");
  const std::size_t train_samples = s.limit_train > 0 ? std::min(s.limit_train, train.size()) : train.size();
  const auto widths = layer_widths(s);
  fashion_mnist::mlp model(widths, train, s.seed);
  dtrain::data::distributed_sampler sampler(train_samples, me, roles.workers, s.seed);
  const std::size_t local_batch = s.global_batch / P;
  const std::size_t steps_per_epoch = sampler.shard_size() / local_batch;
  if (me == 0) {
    fmt::print("fashion_mnist: parameter server, {} server(s), {} worker(s), {}, {}, MLP {}, global batch {} ({} per "
               "worker), {} steps per epoch\n", roles.servers, roles.workers, Consistency::name, Algorithm::name,
               fmt::join(widths, "-"), s.global_batch, local_batch, steps_per_epoch);
  }
  // Every worker starts from what the servers hold, so replicas agree.
  const auto x = model.flat_parameters();
  job.begin(x);
  std::vector<std::size_t> order;
  auto gradient = [&](std::span<const float>, std::span<float> g, std::int64_t t) {
    const auto step = static_cast<std::size_t>(t) % steps_per_epoch;
    if (step == 0) order = sampler.indices(static_cast<std::uint64_t>(t) / steps_per_epoch);
    auto none = [](std::size_t) {};
    model.forward_backward(std::span<const std::size_t>(order).subspan(step * local_batch, local_batch),
                           dtrain::gradient_ready(none));
    const auto grads = model.flat_gradients();
    std::copy(grads.begin(), grads.end(), g.begin());
  };
  auto evaluate = [&] {
    std::size_t hits = 0;
    double loss = 0;
    for (std::size_t at = 0; at < test.size(); at += 1000) {
      const auto [h, l] = model.evaluate(test, at, std::min<std::size_t>(1000, test.size() - at));
      hits += h;
      loss += l;
    }
    return std::pair<double, double>(static_cast<double>(hits) / static_cast<double>(test.size()),
                                     loss / static_cast<double>(test.size()));
  };
  double train_seconds = 0;
  std::vector<double> epoch_seconds;
  std::vector<std::pair<double, double>> curve;
  std::int64_t t = 0;
  bool out_of_time = false;
  for (int epoch = 0; epoch < s.epochs && !out_of_time; ++epoch) {
    const auto start = clock_type::now();
    for (std::size_t step = 0; step < steps_per_epoch; ++step, ++t) {
      job.step(x, gradient, t);
      if (s.time_budget > 0 && train_seconds + since(start) >= s.time_budget) {
        out_of_time = true;
        break;
      }
    }
    const double seconds = since(start);
    train_seconds += seconds;
    epoch_seconds.push_back(seconds);
    if (me == 0) {
      const auto [accuracy, loss] = evaluate();  // this worker's replica
      curve.emplace_back(train_seconds, accuracy);
      fmt::print("epoch {:>2}/{}  replica test accuracy {:.4f}  test loss {:.4f}  {:.2f} s  {:.0f} samples/s\n",
                 epoch + 1, s.epochs, accuracy, loss, seconds,
                 static_cast<double>(steps_per_epoch * s.global_batch) / seconds);
    }
  }
  job.end(x);  // the servers' final parameters
  if (me != 0) return 0;
  const auto [accuracy, loss] = evaluate();
  const double samples_per_second = static_cast<double>(t) * static_cast<double>(s.global_batch) / train_seconds;
  fmt::print("final test accuracy {:.4f}, test loss {:.4f} (the servers' parameters); {:.0f} samples/s over {} "
             "steps; {:.1f} s waiting for the servers; parameters digest {}\n", accuracy, loss, samples_per_second, t,
             w.stats().wait_seconds, digest_of(x));
  write_summary(s, fmt::format("dtrain-ps-{}-{}", Consistency::name, Algorithm::name), roles.workers,
                samples_per_second, epoch_seconds, 0, accuracy, curve, loss);
  return accuracy >= s.min_accuracy ? 0 : 3;
}

inline int run_ps(const settings& s) {
  dtrain::mixed_options to;
  // The servers decide what a lost worker means.
  to.tcp.abort_group_on_peer_loss = to.shm.abort_group_on_peer_loss = false;
  if (s.transport != "auto") to.path = s.transport == "tcp" ? dtrain::peer_path::tcp : dtrain::peer_path::shm;
  auto t = dtrain::mixed_transport::from_environment(to);
  using namespace dtrain;
  using namespace dtrain::ps;
  const double lr = s.lr;
  const auto& c = s.consistency;
  const auto& a = s.algorithm;
  auto bad = [&] {
    return error(errc::invalid_argument,
                 "--algorithm " + a + " does not run under --consistency " + c +
                     " here; see the table of pairs in docs/parameter_server.md (worker algorithms)");
  };
  if (a == "sync") {
    momentum<float> opt(lr, s.momentum);
    if (c == "bsp") return run_ps_with<bsp>(s, std::move(t), opt, sync_sgd<float>());
    if (c == "ssp1") return run_ps_with<ssp<1>>(s, std::move(t), opt, sync_sgd<float>());
    if (c == "ssp4") return run_ps_with<ssp<4>>(s, std::move(t), opt, sync_sgd<float>());
    if (c == "asp") return run_ps_with<asp>(s, std::move(t), opt, sync_sgd<float>());
    if (c == "soft2") return run_ps_with<soft_sync<2>>(s, std::move(t), opt, sync_sgd<float>());
    throw bad();
  }
  if (a == "downpour" && c == "asp")
    return run_ps_with<asp>(s, std::move(t), adagrad<float>(lr), downpour<float>(1, 1));
  if (a == "adag" && c == "asp") return run_ps_with<asp>(s, std::move(t), delta<float>(), adag<float>(lr, s.tau));
  if (a == "easgd" && c == "bsp") {
    return run_ps_with<bsp>(s, std::move(t), delta<float>(),
                            easgd<float>(lr, s.rho, s.tau, easgd<float>::mode::synchronous));
  }
  if (a == "easgd" && c == "asp") {
    return run_ps_with<asp>(s, std::move(t), delta<float>(),
                            easgd<float>(lr, s.rho, s.tau, easgd<float>::mode::asynchronous));
  }
  if (a == "averaging" && c == "bsp")
    return run_ps_with<bsp>(s, std::move(t), delta<float>(), model_averaging<float>(lr, s.tau));
  if (a == "dynsgd" && c == "asp") {
    return run_ps_with<asp>(s, std::move(t), staleness_aware<delta<float>, 1>(delta<float>()),
                            dynsgd<float>(lr, s.tau));
  }
  throw bad();
}

}  // namespace example
