#pragma once
/// @file
/// `ps::trainer<Transport, Consistency, Updater, Algorithm>`: a parameter-server job read as its
/// parts. Every rank constructs the same trainer; server ranks serve, worker ranks run the
/// algorithm on their replica of a dense model.
///
/// <!-- frame: ps_job -->
/// @code
/// using trainer = dtrain::ps::trainer<dtrain::tcp_transport, dtrain::asp, dtrain::adagrad<float>,
///                                     dtrain::ps::downpour<float>>;
/// dtrain::tcp_options options;
/// options.abort_group_on_peer_loss = false;  // a lost server is for fail-over to handle
/// auto transport = dtrain::tcp_transport::from_environment(options);
/// const auto roles = dtrain::ps::roles::from_environment(transport.size());  // DTRAIN_PS_SERVERS
/// trainer job(std::move(transport), dtrain::adagrad<float>(0.1), dtrain::ps::downpour<float>(1, 1), roles);
/// if (job.is_server()) return job.serve(), 0;
/// std::vector<float> weights(1000, 1.0f);  // the model, alike on every worker
/// auto gradient_of_batch = [](std::span<const float> w, std::span<float> g, std::int64_t /*batch*/) {
///   for (std::size_t i = 0; i < w.size(); ++i) g[i] = w[i];  // of |w|^2 / 2
/// };
/// job.begin(weights);
/// for (std::int64_t t = job.first_step(); t < 100; ++t) job.step(weights, gradient_of_batch, t);
/// job.end(weights);
/// @endcode

#include <cstdint>
#include <optional>
#include <span>
#include <utility>

#include "dtrain/concepts/consistency.hpp"
#include "dtrain/concepts/transport.hpp"
#include "dtrain/concepts/updater.hpp"
#include "dtrain/ps/algorithms.hpp"
#include "dtrain/ps/roles.hpp"
#include "dtrain/ps/server.hpp"
#include "dtrain/ps/sharding.hpp"
#include "dtrain/ps/worker.hpp"

namespace dtrain::ps {

template <transport Transport, consistency Consistency, class Updater, class Algorithm, std::floating_point T = float,
          class Initializer = zero_initializer>
  requires updater<Updater, T> && initializer<Initializer, T>
class trainer {
 public:
  using server_type = server<Transport, Consistency, T, Updater, Initializer>;
  using worker_type = worker<Transport, Consistency, T>;

  /// Takes this rank's endpoint; its role follows from `r` (servers are the first ranks).
  /// Workers join the servers here (see `worker`); servers start serving in `serve`.
  /// `init` sets the servers' parameters before the first push (every worker starts from them).
  trainer(Transport t, Updater u, Algorithm algorithm, roles r, ps_options o = {}, Initializer init = {})
      : roles_(r), algorithm_(std::move(algorithm)) {
    if (r.is_server(t.rank())) {
      server_.emplace(std::move(t), r, Consistency{}, std::move(u), std::move(init), o, Algorithm::server_mode);
    } else {
      worker_.emplace(std::move(t), r, range_sharding(r.shard_count()), o);
    }
  }

  bool is_server() const noexcept { return server_.has_value(); }

  /// Worker ranks: the iteration to continue from (0, or the clock of the checkpoint the servers
  /// resumed from; `ps_options::resume`). Bit-exact resumption holds for `sync_sgd` under `bsp`,
  /// whose workers keep no state of their own between iterations.
  std::int64_t first_step() const noexcept { return worker_->clocks(); }

  /// Server ranks: serve until every worker is done. @returns the server's statistics
  const server_stats& serve() {
    server_->run();
    return server_->stats();
  }

  /// Worker ranks: register the model `x` (all workers alike) and start from the server's values.
  void begin(std::span<T> x) { algorithm_.begin(*worker_, x); }
  /// Worker ranks: one iteration; `grad(x, g, t)` writes the gradient at `x` on batch t into `g`.
  template <class Grad>
  void step(std::span<T> x, Grad&& grad, std::int64_t t) {
    algorithm_.step(*worker_, x, std::forward<Grad>(grad), t);
  }
  /// Worker ranks: finish, then fetch the final center into `x`.
  void end(std::span<T> x) {
    algorithm_.end(*worker_, x);
    auto c = worker_->clock();
    worker_->wait(c);
    auto r = worker_->pull_dense(0, x);
    worker_->wait(r);
    worker_->finish();
  }

  worker_type& worker_endpoint() noexcept { return *worker_; }
  server_type& server_endpoint() noexcept { return *server_; }
  const roles& group() const noexcept { return roles_; }

 private:
  roles roles_;
  Algorithm algorithm_;
  std::optional<server_type> server_;
  std::optional<worker_type> worker_;
};

}  // namespace dtrain::ps
