#pragma once
/// @file
/// The worker algorithms of the parameter-server literature, each written as the equations of
/// its paper (docs/parameter_server.md lists them with their sources). An algorithm keeps the
/// worker's own state and runs one iteration per `step`; the model is one dense tensor of n
/// values, the local replica `x`, and the server's copy is the center `x~`.
///
/// Each algorithm says how the server must apply its pushes (`server_mode`):
///  - gradient algorithms (synchronous SGD, Downpour) push gradients, `apply_mode::update`: the
///    server averages a round's gradients and its updater is the optimizer (Adagrad for
///    Downpour, as in Dean et al. 2012);
///  - ADAG, EASGD and model averaging push parameter changes that the center adds up,
///    `apply_mode::sum` (x~ <- x~ + sum of d);
///  - DynSGD pushes changes scaled by their staleness: `apply_mode::update` with the updater
///    `staleness_aware<delta<T>, 1>` (x~ <- x~ + d / (s + 1)), under `asp`.
///
/// `grad(x, g, t)` is the model: it writes into `g` the gradient at `x` on the worker's batch
/// for iteration t.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "dtrain/compress/topk.hpp"
#include "dtrain/ps/table.hpp"

namespace dtrain::ps {

namespace detail {
// Registers the model as a dense tensor and starts from the server's values.
template <class Worker, class T>
std::size_t join_model(Worker& w, std::span<T> x) {
  const std::size_t tensor = w.add_dense(x.size());
  auto r = w.pull_dense(tensor, x);
  w.wait(r);
  return tensor;
}

template <class Worker>
void finish_clock(Worker& w) {
  auto r = w.clock();
  w.wait(r);
}

// Pushes `values`, finishes the clock and fetches the center into `x`, all in flight at once;
// the pull is answered once the consistency model lets this clock's updates be seen.
template <class Worker, class T>
void push_clock_pull(Worker& w, std::size_t tensor, std::span<const T> values, std::span<T> x) {
  auto pushed = w.push_dense(tensor, values);
  auto clocked = w.clock();
  auto pulled = w.pull_dense(tensor, x);
  w.wait(pushed);
  w.wait(clocked);
  w.wait(pulled);
}

// What ADAG, model averaging and DynSGD share: local SGD steps x <- x - eta g, and every
// `period` iterations push (x - anchor) * scale, finish the clock, fetch x~ and re-anchor there.
template <class T>
class periodic_delta {
 public:
  periodic_delta(double eta, int period) : eta_(static_cast<T>(eta)), period_(std::max(1, period)) {}

  template <class Worker>
  void begin(Worker& w, std::span<T> x) {
    tensor_ = join_model(w, x);
    g_.resize(x.size());
    anchor_.assign(x.begin(), x.end());
  }

  template <class Worker>
  void end(Worker&, std::span<T>) {}

  int period() const noexcept { return period_; }

 protected:
  template <class Worker, class Grad>
  void local_step(Worker& w, std::span<T> x, Grad&& grad, std::int64_t t, T scale) {
    grad(std::span<const T>(x), std::span<T>(g_), t);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] -= eta_ * g_[i];
    if ((t + 1) % period_ == 0) {
      for (std::size_t i = 0; i < x.size(); ++i) g_[i] = (x[i] - anchor_[i]) * scale;
      push_clock_pull(w, tensor_, std::span<const T>(g_), x);
      anchor_.assign(x.begin(), x.end());
    } else {
      finish_clock(w);
    }
  }

 private:
  T eta_;
  int period_;
  std::size_t tensor_ = 0;
  std::vector<T> g_, anchor_;
};
}  // namespace detail

/// Synchronous SGD: every iteration push the gradient, finish the clock, pull the new x~.
/// Under `bsp` this is data-parallel SGD with the server's optimizer on the mean gradient.
template <class T = float>
class sync_sgd {
 public:
  static constexpr std::string_view name = "sync_sgd";
  static constexpr apply_mode server_mode = apply_mode::update;

  template <class Worker>
  void begin(Worker& w, std::span<T> x) {
    tensor_ = detail::join_model(w, x);
    g_.resize(x.size());
  }

  template <class Worker, class Grad>
  void step(Worker& w, std::span<T> x, Grad&& grad, std::int64_t t) {
    grad(std::span<const T>(x), std::span<T>(g_), t);
    detail::push_clock_pull(w, tensor_, std::span<const T>(g_), x);
  }

  template <class Worker>
  void end(Worker&, std::span<T>) {}

 private:
  std::size_t tensor_ = 0;
  std::vector<T> g_;
};

/// Synchronous SGD with top-k sparsified pushes and error feedback (compress/topk.hpp): each
/// iteration pushes only the ceil(density * n) largest entries of gradient + residual, as sparse
/// keys (coordinate j is key j of the sparse table), and keeps the rest for later iterations;
/// the server averages a round's pushes (an entry a worker did not send counts as zero) and
/// steps its updater. The model lives in the sparse table, pulled whole each iteration (the
/// same key list every time: with `ps_options::cache_keys` it travels once).
template <class T = float>
class topk_sgd {
 public:
  static constexpr std::string_view name = "topk_sgd";
  static constexpr apply_mode server_mode = apply_mode::update;
  explicit topk_sgd(double density) : density_(density) { (void)topk_count(1, density); }

  template <class Worker>
  void begin(Worker& w, std::span<T> x) {
    keys_.resize(x.size());
    for (std::size_t j = 0; j < keys_.size(); ++j) keys_[j] = static_cast<key_type>(j);
    compressor_ = topk_compressor<T>(x.size());
    g_.resize(x.size());
    const std::size_t k = topk_count(x.size(), density_);
    indices_.resize(k);
    sent_keys_.resize(k);
    sent_.resize(k);
    read_center(w, x);
  }

  template <class Worker, class Grad>
  void step(Worker& w, std::span<T> x, Grad&& grad, std::int64_t t) {
    grad(std::span<const T>(x), std::span<T>(g_), t);
    compressor_.compress(g_, indices_, sent_);
    std::transform(indices_.begin(), indices_.end(), sent_keys_.begin(),
                   [](std::int32_t i) { return static_cast<key_type>(i); });
    auto pushed = w.push(sent_keys_, std::span<const T>(sent_), 1);
    auto clocked = w.clock();
    auto pulled = w.pull(keys_, x, 1);
    w.wait(pushed);
    w.wait(clocked);
    w.wait(pulled);
  }

  template <class Worker>
  void end(Worker&, std::span<T>) {}

  /// The server's copy of the model into `x`.
  template <class Worker>
  void read_center(Worker& w, std::span<T> x) {
    auto r = w.pull(keys_, x, 1);
    w.wait(r);
  }

  /// What has not been pushed yet.
  std::span<const T> residual() const noexcept { return compressor_.residual(); }

 private:
  double density_;
  std::vector<key_type> keys_, sent_keys_;
  topk_compressor<T> compressor_;
  std::vector<T> g_, sent_;
  std::vector<std::int32_t> indices_;
};

/// Downpour SGD (Dean et al. 2012): gradients computed at the last fetched parameters are
/// accumulated and pushed every `n_push` iterations; parameters are fetched every `n_fetch`.
/// The server applies Adagrad.
template <class T = float>
class downpour {
 public:
  static constexpr std::string_view name = "downpour";
  static constexpr apply_mode server_mode = apply_mode::update;
  explicit downpour(int n_push = 1, int n_fetch = 1) : n_push_(std::max(1, n_push)), n_fetch_(std::max(1, n_fetch)) {}

  template <class Worker>
  void begin(Worker& w, std::span<T> x) {
    tensor_ = detail::join_model(w, x);
    g_.resize(x.size());
    acc_.assign(x.size(), T(0));
  }

  template <class Worker, class Grad>
  void step(Worker& w, std::span<T> x, Grad&& grad, std::int64_t t) {
    grad(std::span<const T>(x), std::span<T>(g_), t);
    for (std::size_t i = 0; i < g_.size(); ++i) acc_[i] += g_[i];
    if ((t + 1) % n_push_ == 0) {
      auto pushed = w.push_dense(tensor_, std::span<const T>(acc_));
      w.wait(pushed);
      std::fill(acc_.begin(), acc_.end(), T(0));
    }
    detail::finish_clock(w);
    if ((t + 1) % n_fetch_ == 0) {
      auto pulled = w.pull_dense(tensor_, x);
      w.wait(pulled);
    }
  }

  template <class Worker>
  void end(Worker&, std::span<T>) {}

 private:
  int n_push_, n_fetch_;
  std::size_t tensor_ = 0;
  std::vector<T> g_, acc_;
};

/// ADAG (dist-keras): local SGD steps x <- x - eta g; after every `window` iterations push
/// (x - x_last_sync) / window, which the server adds to x~, then fetch x~.
template <class T = float>
class adag : public detail::periodic_delta<T> {
 public:
  static constexpr std::string_view name = "adag";
  static constexpr apply_mode server_mode = apply_mode::sum;
  adag(double eta, int window) : detail::periodic_delta<T>(eta, window) {}

  template <class Worker, class Grad>
  void step(Worker& w, std::span<T> x, Grad&& grad, std::int64_t t) {
    this->local_step(w, x, grad, t, T(1) / static_cast<T>(this->period()));
  }
};

/// EASGD (Zhang, Choromanska and LeCun 2015), alpha = eta * rho, period tau.
///  - synchronous (run it under `bsp`): every tau-th iteration, from x~ of the previous clocks,
///    x <- x - eta g(x) - alpha (x - x~) and the server adds alpha (x - x~) of every worker to x~;
///    other iterations x <- x - eta g(x).
///  - asynchronous (Algorithm 1, under `asp`): every tau-th iteration fetch x~, e = alpha (x - x~),
///    x <- x - e, push e; then x <- x - eta g(x).
template <class T = float>
class easgd {
 public:
  static constexpr std::string_view name = "easgd";
  static constexpr apply_mode server_mode = apply_mode::sum;
  enum class mode { synchronous, asynchronous };
  easgd(double eta, double rho, int tau, mode m)
      : eta_(static_cast<T>(eta)), alpha_(static_cast<T>(eta * rho)), tau_(std::max(1, tau)), mode_(m) {}

  template <class Worker>
  void begin(Worker& w, std::span<T> x) {
    tensor_ = detail::join_model(w, x);
    g_.resize(x.size());
    center_.resize(x.size());
    e_.resize(x.size());
  }

  template <class Worker, class Grad>
  void step(Worker& w, std::span<T> x, Grad&& grad, std::int64_t t) {
    const bool elastic = t % tau_ == 0;
    if (elastic) {
      auto pulled = w.pull_dense(tensor_, std::span<T>(center_));
      w.wait(pulled);
      for (std::size_t i = 0; i < x.size(); ++i) e_[i] = alpha_ * (x[i] - center_[i]);
    }
    if (mode_ == mode::synchronous) {
      grad(std::span<const T>(x), std::span<T>(g_), t);  // at x_t, like the elastic term
      for (std::size_t i = 0; i < x.size(); ++i) x[i] = x[i] - eta_ * g_[i] - (elastic ? e_[i] : T(0));
    } else {
      if (elastic) {
        for (std::size_t i = 0; i < x.size(); ++i) x[i] -= e_[i];
      }
      grad(std::span<const T>(x), std::span<T>(g_), t);  // after the elastic move
      for (std::size_t i = 0; i < x.size(); ++i) x[i] -= eta_ * g_[i];
    }
    if (elastic) {
      auto pushed = w.push_dense(tensor_, std::span<const T>(e_));
      w.wait(pushed);
    }
    detail::finish_clock(w);
  }

  template <class Worker>
  void end(Worker&, std::span<T>) {}

 private:
  T eta_, alpha_;
  int tau_;
  mode mode_;
  std::size_t tensor_ = 0;
  std::vector<T> g_, center_, e_;
};

/// Model averaging: local SGD x <- x - eta g; every `period` iterations every worker pushes
/// (x - x~) / workers, so x~ becomes the mean of the replicas, and fetches it. Run under `bsp`.
template <class T = float>
class model_averaging : public detail::periodic_delta<T> {
 public:
  static constexpr std::string_view name = "model_averaging";
  static constexpr apply_mode server_mode = apply_mode::sum;
  model_averaging(double eta, int period) : detail::periodic_delta<T>(eta, period) {}

  template <class Worker, class Grad>
  void step(Worker& w, std::span<T> x, Grad&& grad, std::int64_t t) {
    this->local_step(w, x, grad, t, T(1) / static_cast<T>(w.group().workers));
  }
};

/// DynSGD (dist-keras's DynSGD parameter server): pull x~, run `window` local SGD steps, push
/// the change d = x - x_pulled; the server applies x~ <- x~ + d / (s + 1), s being the versions
/// applied since the pull (run the server with `staleness_aware<delta<T>, 1>`, under `asp`).
template <class T = float>
class dynsgd : public detail::periodic_delta<T> {
 public:
  static constexpr std::string_view name = "dynsgd";
  static constexpr apply_mode server_mode = apply_mode::update;
  dynsgd(double eta, int window = 1) : detail::periodic_delta<T>(eta, window) {}

  template <class Worker, class Grad>
  void step(Worker& w, std::span<T> x, Grad&& grad, std::int64_t t) {
    this->local_step(w, x, grad, t, T(1));
  }
};

}  // namespace dtrain::ps
