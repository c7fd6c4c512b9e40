// Each updater against its equations, stepped serially here in double precision, and against
// closed forms where they exist.

#include <cmath>
#include <cstdint>
#include <cstddef>
#include <vector>

#include "../catch.hpp"
#include "dtrain/updater/adagrad.hpp"
#include "dtrain/updater/adam.hpp"
#include "dtrain/updater/ftrl.hpp"
#include "dtrain/updater/momentum.hpp"
#include "dtrain/updater/rmsprop.hpp"
#include "dtrain/updater/sgd.hpp"
#include "dtrain/updater/staleness_aware.hpp"

using namespace dtrain;

namespace {
// A deterministic gradient sequence for parameter i at step k.
double grad(std::size_t i, int k) { return std::sin(0.7 * static_cast<double>(i) + 1.3 * k) + 0.1 * k; }

template <class U, class Ref>
void check_against(U u, Ref reference, std::size_t n, int steps, double tol) {
  std::vector<double> w(n), ref_w(n);
  for (std::size_t i = 0; i < n; ++i) w[i] = ref_w[i] = 0.5 - 0.01 * static_cast<double>(i);
  u.resize(n);
  std::vector<double> state(n * 3, 0.0);
  for (int k = 0; k < steps; ++k) {
    std::vector<double> g(n);
    for (std::size_t i = 0; i < n; ++i) g[i] = grad(i, k);
    // Step in two slices, as a sharded server would: state follows the offset. The step count
    // is the trainers' (per tensor), for the updaters that read it.
    std::size_t half = n / 2;
    step_info info;
    info.step = static_cast<std::uint64_t>(k + 1);
    u.step(std::span(w).first(half), std::span<const double>(g).first(half), 0, info);
    u.step(std::span(w).subspan(half), std::span<const double>(g).subspan(half), half, info);
    for (std::size_t i = 0; i < n; ++i) reference(ref_w[i], g[i], &state[i * 3], k + 1);
  }
  for (std::size_t i = 0; i < n; ++i) REQUIRE(w[i] == Approx(ref_w[i]).epsilon(tol));
}
}  // namespace

TEST_CASE("sgd: w - lr * sum of gradients", "[updater]") {
  sgd<double> u(0.1);
  u.resize(1);
  std::vector<double> w{1.0};
  for (int k = 0; k < 10; ++k) {
    std::vector<double> g{2.0};
    u.step(std::span(w), std::span<const double>(g), 0, {});
  }
  CHECK(w[0] == Approx(1.0 - 0.1 * 2.0 * 10));  // closed form
  CHECK(u.state().empty());
}

TEST_CASE("momentum: heavy ball and Nesterov follow their recurrences", "[updater]") {
  // Closed form for a constant gradient g: v_k = g (1 - mu^k) / (1 - mu).
  momentum<double> hb(0.1, 0.9);
  hb.resize(1);
  std::vector<double> x{0.0};
  double expect = 0;
  for (int k = 1; k <= 20; ++k) {
    std::vector<double> g{1.0};
    hb.step(std::span(x), std::span<const double>(g), 0, {});
    expect -= 0.1 * (1 - std::pow(0.9, k)) / (1 - 0.9);
  }
  CHECK(x[0] == Approx(expect));
  CHECK(hb.state()[0] == Approx((1 - std::pow(0.9, 20)) / 0.1));
  check_against(momentum<double>(0.05, 0.8, true),
                [](double& w, double g, double* s, int) {
                  s[0] = 0.8 * s[0] + g;
                  w -= 0.05 * (g + 0.8 * s[0]);
                },
                37, 25, 1e-12);
}

TEST_CASE("weight decay: SGD and momentum add wd * w to the gradient, AdamW decays apart", "[updater]") {
  // SGD with no gradient shrinks w geometrically: w_k = (1 - lr wd)^k w_0.
  sgd<double> plain(0.1, 0.5);
  plain.resize(1);
  std::vector<double> w{2.0}, zero{0.0};
  for (int k = 0; k < 7; ++k) plain.step(std::span(w), std::span<const double>(zero), 0, {});
  CHECK(w[0] == Approx(2.0 * std::pow(1 - 0.05, 7)));
  check_against(
      sgd<double>(0.1, 0.01), [](double& x, double g, double*, int) { x -= 0.1 * (g + 0.01 * x); }, 19, 20, 1e-12);
  check_against(momentum<double>(0.05, 0.9, false, 0.02),
                [](double& x, double g, double* s, int) {
                  g += 0.02 * x;  // PyTorch: d_p = d_p + wd * p before the momentum buffer
                  s[0] = 0.9 * s[0] + g;
                  x -= 0.05 * s[0];
                },
                23, 25, 1e-12);
  check_against(momentum<double>(0.05, 0.8, true, 0.02),
                [](double& x, double g, double* s, int) {
                  g += 0.02 * x;
                  s[0] = 0.8 * s[0] + g;
                  x -= 0.05 * (g + 0.8 * s[0]);
                },
                23, 25, 1e-12);
  // AdamW: PyTorch's order, decay first (p *= 1 - lr wd), then Adam on the undecayed gradient.
  check_against(adamw<double>(0.01, 0.1, 0.9, 0.999, 1e-8),
                [](double& x, double g, double* s, int k) {
                  x *= 1 - 0.01 * 0.1;
                  s[0] = 0.9 * s[0] + 0.1 * g;
                  s[1] = 0.999 * s[1] + 0.001 * g * g;
                  x -= 0.01 * (s[0] / (1 - std::pow(0.9, k))) / (std::sqrt(s[1] / (1 - std::pow(0.999, k))) + 1e-8);
                },
                33, 50, 1e-10);
  // Decoupled, unlike L2: with a zero gradient AdamW still shrinks w by (1 - lr wd) a step while
  // Adam with the same decay added to the gradient would move it by lr * sign(w) a step.
  adamw<double> decoupled(0.01, 0.5, 0.9, 0.999, 1e-8);  // m = v = 0: the Adam step is 0 / eps = 0
  decoupled.resize(1);
  std::vector<double> x{3.0};
  for (int k = 0; k < 5; ++k)
    decoupled.step(std::span(x), std::span<const double>(zero), 0,
                   step_info{0, 1.0, static_cast<std::uint64_t>(k + 1)});
  CHECK(x[0] == Approx(3.0 * std::pow(1 - 0.005, 5)));
  static_assert(updater<adamw<float>> && updater<adamw<double>, double>);
}

TEST_CASE("adagrad: lr * g / (sqrt(sum g^2) + eps)", "[updater]") {
  check_against(adagrad<double>(0.3, 1e-10),
                [](double& w, double g, double* s, int) {
                  s[0] += g * g;
                  w -= 0.3 * g / (std::sqrt(s[0]) + 1e-10);
                },
                29, 30, 1e-12);
  // Closed form, constant gradient g: sum_k = k g^2, so step k moves lr / sqrt(k).
  adagrad<double> u(1.0, 0.0);
  u.resize(1);
  std::vector<double> w{0.0};
  double expect = 0;
  for (int k = 1; k <= 16; ++k) {
    std::vector<double> g{3.0};
    u.step(std::span(w), std::span<const double>(g), 0, {});
    expect -= 1.0 / std::sqrt(static_cast<double>(k));
  }
  CHECK(w[0] == Approx(expect));
}

TEST_CASE("rmsprop: running mean of squares", "[updater]") {
  check_against(rmsprop<double>(0.01, 0.9, 1e-8),
                [](double& w, double g, double* s, int) {
                  s[0] = 0.9 * s[0] + 0.1 * g * g;
                  w -= 0.01 * g / (std::sqrt(s[0]) + 1e-8);
                },
                31, 40, 1e-12);
}

TEST_CASE("adam: bias-corrected moments", "[updater]") {
  check_against(adam<double>(0.01, 0.9, 0.999, 1e-8),
                [](double& w, double g, double* s, int k) {
                  s[0] = 0.9 * s[0] + 0.1 * g;
                  s[1] = 0.999 * s[1] + 0.001 * g * g;
                  double mh = s[0] / (1 - std::pow(0.9, k));
                  double vh = s[1] / (1 - std::pow(0.999, k));
                  w -= 0.01 * mh / (std::sqrt(vh) + 1e-8);
                },
                33, 50, 1e-10);
  // Closed form: with a constant gradient, m_hat = g and v_hat = g^2 at every step, so each step
  // moves lr * g / (|g| + eps), i.e. lr * sign(g) for eps = 0.
  adam<double> u(0.05, 0.9, 0.999, 0.0);
  u.resize(2);
  std::vector<double> w{0.0, 0.0};
  for (int k = 0; k < 12; ++k) {
    std::vector<double> g{4.0, -0.25};
    step_info info;
    info.step = static_cast<std::uint64_t>(k + 1);
    u.step(std::span(w), std::span<const double>(g), 0, info);
  }
  CHECK(w[0] == Approx(-0.05 * 12));
  CHECK(w[1] == Approx(0.05 * 12));
  STATIC_REQUIRE(adam<double>::state_slots == 2);  // m and v: the count is the tensor's, not kept per element
  // Without the tensor's count, adam refuses rather than guess one.
  REQUIRE_THROWS_WITH(u.step(std::span(w), std::span<const double>(w), 0, {}), Catch::Contains("lazy_adam"));
}

TEST_CASE("lazy_adam: bias-corrected as adam for dense updates", "[updater]") {
  check_against(lazy_adam<double>(0.01, 0.9, 0.999, 1e-8),
                [](double& w, double g, double* s, int k) {
                  s[0] = 0.9 * s[0] + 0.1 * g;
                  s[1] = 0.999 * s[1] + 0.001 * g * g;
                  w -= 0.01 * (s[0] / (1 - std::pow(0.9, k))) / (std::sqrt(s[1] / (1 - std::pow(0.999, k))) + 1e-8);
                },
                33, 50, 1e-10);
}

TEST_CASE("lazy_adam: a sparse key stepped less often keeps its own bias correction", "[updater]") {
  lazy_adam<double> u(0.1, 0.9, 0.999, 0.0);
  u.resize(2);
  std::vector<double> w{0.0, 0.0};
  std::vector<double> g{1.0};
  for (int k = 0; k < 5; ++k) u.step(std::span(w).first(1), std::span<const double>(g), 0, {});
  u.step(std::span(w).last(1), std::span<const double>(g), 1, {});  // first touch of key 1
  CHECK(w[1] == Approx(-0.1));  // a first step is always lr * sign(g)
  CHECK(u.state()[2] == 5.0);
  CHECK(u.state()[5] == 1.0);
}

TEST_CASE("staleness_aware: the rate is divided by the staleness", "[updater]") {
  staleness_aware<sgd<double>> u(0.4);
  u.resize(1);
  std::vector<double> w{0.0};
  std::vector<double> g{1.0};
  u.step(std::span(w), std::span<const double>(g), 0, step_info{4, 1.0});
  CHECK(w[0] == Approx(-0.1));
  u.step(std::span(w), std::span<const double>(g), 0, step_info{0, 1.0});  // fresh: full rate
  CHECK(w[0] == Approx(-0.5));
  u.set_learning_rate(1.0);
  u.step(std::span(w), std::span<const double>(g), 0, step_info{2, 0.5});  // schedule * 1/2
  CHECK(w[0] == Approx(-0.75));
}

TEST_CASE("ftrl: McMahan et al.'s Algorithm 1, and w minimises the proximal objective", "[updater]") {
  const double alpha = 0.5, beta = 1.0, l1 = 0.3, l2 = 0.2;
  // The paper's order: predict with w_t, then update z and n from g and recompute w. The weight
  // held stands for w_t (the two agree once FTRL has produced it; initial weights enter once).
  auto weight_of = [&](double z, double n) {
    if (std::fabs(z) <= l1) return 0.0;
    return -(z - std::copysign(l1, z)) / ((beta + std::sqrt(n)) / alpha + l2);
  };
  check_against(ftrl<double>(alpha, beta, l1, l2),
                [&](double& w, double g, double* s, int) {
                  const double w_t = w;
                  const double sigma = (std::sqrt(s[1] + g * g) - std::sqrt(s[1])) / alpha;
                  s[0] += g - sigma * w_t;
                  s[1] += g * g;
                  w = weight_of(s[0], s[1]);
                },
                31, 25, 1e-12);
  // w = argmin_w z w + l1 |w| + (l2 + (beta + sqrt(n)) / alpha) w^2 / 2: no small move improves it.
  ftrl<double> u(alpha, beta, l1, l2);
  u.resize(1);
  std::vector<double> w{0.0};
  for (int k = 0; k < 40; ++k) {
    const double g = std::sin(0.9 * k) + 0.2;
    u.step(std::span(w), std::span<const double>(&g, 1), 0, step_info{});
    const double z = u.state()[0], n = u.state()[1];
    auto objective = [&](double x) {
      return z * x + l1 * std::fabs(x) + 0.5 * (l2 + (beta + std::sqrt(n)) / alpha) * x * x;
    };
    for (double d : {1e-4, -1e-4}) CHECK(objective(w[0]) <= objective(w[0] + d) + 1e-15);
  }
  // A strong L1 keeps every weight at exactly zero.
  ftrl<double> sparse(alpha, beta, /*l1=*/100.0, l2);
  sparse.resize(3);
  std::vector<double> ws(3, 0.0), gs{0.5, -0.7, 0.1};
  for (int k = 0; k < 20; ++k) sparse.step(std::span(ws), std::span<const double>(gs), 0, step_info{});
  CHECK(ws == std::vector<double>{0.0, 0.0, 0.0});
}

TEST_CASE("updaters: resize keeps existing state", "[updater]") {
  momentum<float> u(0.1f, 0.5);
  u.resize(2);
  std::vector<float> w{0.0f, 0.0f}, g{1.0f, 2.0f};
  u.step(std::span(w), std::span<const float>(g), 0, {});
  u.resize(5);
  CHECK(u.parameters() == 5);
  CHECK(u.state()[0] == 1.0f);
  CHECK(u.state()[1] == 2.0f);
  CHECK(u.state()[4] == 0.0f);
}
