// The stage-3 sharded trainer (parameters sharded, gathered unit by unit) against the serial
// references: the allreduce trainer's momentum simulation and one Adam over the whole model;
// what each rank holds against the closed form; start-up agreement and misuse.

#include <chrono>
#include <cstddef>
#include <string>
#include <thread>
#include <vector>

#include "../allreduce/checks.hpp"  // require_close
#include "../allreduce/simulation.hpp"
#include "../catch.hpp"
#include "dtrain/collective/communicator.hpp"
#include "dtrain/sharded/unit_trainer.hpp"
#include "dtrain/transport/inproc.hpp"
#include "dtrain/updater/adagrad.hpp"
#include "dtrain/updater/adam.hpp"
#include "dtrain/updater/ftrl.hpp"
#include "dtrain/updater/momentum.hpp"
#include "dtrain/updater/rmsprop.hpp"
#include "references.hpp"
#include "unit_model.hpp"

using namespace dtrain;
using namespace dtrain::testing;
using comm_t = ring<inproc_transport>;

namespace {

template <class Updater>
struct run_result {
  std::vector<std::vector<double>> weights;  // per rank: every unit gathered, side by side
  std::vector<sharded::memory_use> peak;
};

template <class Updater>
run_result<Updater> train(int p, int steps, Updater updater, std::size_t limit) {
  run_result<Updater> out{std::vector<std::vector<double>>(static_cast<std::size_t>(p)),
                          std::vector<sharded::memory_use>(static_cast<std::size_t>(p))};
  sharded::trainer_options o;
  o.limit_all_gathers = limit;
  run_inproc(p, [&](int r, inproc_transport t) {
    auto data = data_of(r);
    unit_linear_model m(unit_sizes, data, r == 0 ? 0.25 : 1.0 + r);  // the root's start must win
    sharded::trainer<comm_t, sharded::zero3, Updater, unit_linear_model> tr(comm_t(std::move(t)), updater, m, o);
    for (int k = 0; k < steps; ++k) {
      const std::size_t begin = (static_cast<std::size_t>(k) * batch) % 400;
      tr.step({begin, begin + batch});
    }
    auto& w = out.weights[static_cast<std::size_t>(r)];
    for (std::size_t u = 0; u < unit_sizes.size(); ++u) {
      const auto whole = tr.unit_parameters(u);
      w.insert(w.end(), whole.begin(), whole.end());
    }
    out.peak[static_cast<std::size_t>(r)] = tr.peak_memory();
  });
  return out;
}

}  // namespace

TEST_CASE("stage 3 equals the serial simulation, every rank gathering the same weights", "[sharded]") {
  for (int p : {1, 2, 3, 4, 5, 8}) {
    for (std::size_t limit : {1, 2, 4}) {
      INFO("ranks " << p << ", limit_all_gathers " << limit);
      const auto got = train(p, 30, momentum<double>(lr, mu), limit);
      require_close(got.weights[0], simulate(p, 30, 1, 0)[0], 1e-12);
      for (const auto& w : got.weights) REQUIRE(w == got.weights[0]);
    }
  }
}

TEST_CASE("stage 3 Adam, Adagrad, RMSProp and FTRL equal one updater over the whole model", "[sharded]") {
  for (int p : {2, 3, 5, 8}) {
    INFO("ranks " << p);
    require_close(train(p, 25, adam<double>(0.01), 2).weights[0], serial_training(p, 25, adam<double>(0.01)), 1e-12);
    require_close(train(p, 25, adagrad<double>(0.05), 2).weights[0], serial_training(p, 25, adagrad<double>(0.05)),
                  1e-12);
    require_close(train(p, 25, rmsprop<double>(0.01), 2).weights[0], serial_training(p, 25, rmsprop<double>(0.01)),
                  1e-12);
    const ftrl<double> proximal(0.5, 1.0, 0.01, 0.01);
    require_close(train(p, 25, proximal, 2).weights[0], serial_training(p, 25, proximal), 1e-12);
  }
}

TEST_CASE("stage 3: each rank holds its slices, and at most limit_all_gathers units gathered", "[sharded]") {
  // Slices of the units 43, 18, 60, 9 at P = 3: 15 + 6 + 20 + 3 = 44 weights; padded units 45,
  // 18, 60, 9. One unit at a time: the largest, 60; two: at most the largest neighbours, 18 + 60.
  const std::size_t d = sizeof(double);
  const auto one = train(3, 3, adam<double>(0.01), 1);
  const auto two = train(3, 3, adam<double>(0.01), 2);
  for (std::size_t r = 0; r < 3; ++r) {
    INFO("rank " << r);
    CHECK(one.peak[r].parameters == 44 * d);
    CHECK(one.peak[r].gradients == 44 * d);
    CHECK(one.peak[r].optimizer_state == 2 * 44 * d);
    CHECK(one.peak[r].buffers == 0);
    CHECK(one.peak[r].gathered == 60 * d);
    CHECK(two.peak[r].gathered >= 60 * d);
    CHECK(two.peak[r].gathered <= 78 * d);
    CHECK(two.peak[r].gathered < 130 * d);  // never the whole model
  }
}

TEST_CASE("stage 3 frees each unit when the model lets it go, and gathers the next while one computes",
          "[sharded]") {
  // At P = 3 the units pad to 45, 18, 60 and 9 weights. The model looks at the trainer's own
  // bytes from inside its pass: after forward_done(u) nothing of u is left; with a limit of 1
  // nothing else is gathered either; with 2 the next unit arrives while u is still computing
  // (the model waits for it there, up to 5 s); after backward_done(u) its gradients go once
  // reduced (the model waits for that, up to 5 s).
  const std::size_t padded[] = {45, 18, 60, 9}, d = sizeof(double);
  for (std::size_t limit : {1, 2}) {
    INFO("limit_all_gathers " << limit);
    std::vector<std::vector<std::string>> faults(3);
    run_inproc(3, [&](int r, inproc_transport t) {
      auto data = data_of(r);
      unit_linear_model m(unit_sizes, data, 0.25);
      sharded::trainer_options o;
      o.limit_all_gathers = limit;
      using trainer_t = sharded::trainer<comm_t, sharded::zero3, adam<double>, unit_linear_model>;
      trainer_t tr(comm_t(std::move(t)), adam<double>(0.01), m, o);
      auto& mine = faults[static_cast<std::size_t>(r)];
      auto wait_for = [&](auto&& done) {
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while (!done() && std::chrono::steady_clock::now() < until)
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        return done();
      };
      m.on = [&](const std::string& event, std::size_t u) {
        const std::size_t next = u + 1;
        if (event == "forward" && limit == 2 && next < 4) {
          if (!wait_for([&] { return tr.memory().gathered == (padded[u] + padded[next]) * d; })) {
            mine.push_back("unit " + std::to_string(next) + " not gathered while unit " + std::to_string(u) + " ran");
          }
        } else if (event == "forward" && limit == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
          if (tr.memory().gathered != padded[u] * d)
            mine.push_back("more than unit " + std::to_string(u) + " gathered");
        } else if (event == "forward_done") {
          const std::size_t left = tr.memory().gathered, allowed = limit == 2 && next < 4 ? padded[next] * d : 0;
          if (left != allowed) mine.push_back("after forward_done(" + std::to_string(u) + "): " + std::to_string(left));
        } else if (event == "backward_done") {
          if (!wait_for([&] { return tr.memory().unit_gradients == 0; })) {
            mine.push_back("unit " + std::to_string(u) + "'s gradients never freed");
          }
        }
      };
      for (int k = 0; k < 3; ++k) tr.step({0, batch});
    });
    for (const auto& f : faults) CHECK(f == std::vector<std::string>{});
  }
}

TEST_CASE("stage 3: a unit the forward pass never reads is dropped when its prefetch lands", "[sharded]") {
  // Unit 1 is prefetched while unit 0 runs, but the model never reads it in forward: its
  // gather must not survive forward_done(1) (which once left a stale buffer read in backward).
  std::vector<sharded::memory_use> peak(3);
  std::vector<std::vector<double>> got(3);
  run_inproc(3, [&](int r, inproc_transport t) {
    auto data = data_of(r);
    unit_linear_model m(unit_sizes, data, 0.25);
    m.skip_in_forward = 1;
    sharded::trainer<comm_t, sharded::zero3, momentum<double>, unit_linear_model> tr(comm_t(std::move(t)),
                                                                                     momentum<double>(lr, mu), m);
    for (int k = 0; k < 20; ++k) tr.step({0, batch});
    peak[static_cast<std::size_t>(r)] = tr.peak_memory();
    got[static_cast<std::size_t>(r)] = tr.unit_parameters(1);
  });
  for (std::size_t r = 0; r < 3; ++r) {
    CHECK(peak[r].gathered <= 78 * sizeof(double));  // the largest neighbours, 18 + 60
    CHECK(got[r] == got[0]);
  }
}

TEST_CASE("stage 3: ranks with different units fail at start-up, all of them, naming the rank", "[sharded]") {
  std::vector<std::string> errors(3);
  run_inproc(3, [&](int r, inproc_transport t) {
    auto data = data_of(r);
    auto mine = unit_sizes;
    if (r == 1) mine = {{3, 40}, {1, 17}, {61}, {8}};  // the same total, other units
    unit_linear_model m(mine, data, 0.25);
    try {
      sharded::trainer<comm_t, sharded::zero3, momentum<double>, unit_linear_model> tr(comm_t(std::move(t)),
                                                                                       momentum<double>(lr, mu), m);
    } catch (const error& e) {
      if (e.code() == make_error_code(errc::invalid_argument)) errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  for (const auto& e : errors) {
    INFO(e);
    CHECK(e.find("ranks disagree on the model's units") != std::string::npos);
    CHECK(e.find("the units' tensor sizes: rank 0 has digest") != std::string::npos);
    CHECK(e.find("rank 1 has digest") != std::string::npos);
  }
}

namespace {
// The unit model, but its backward pass forgets to say that unit 2 is done.
struct forgetful : unit_linear_model {
  using unit_linear_model::unit_linear_model;
  struct forgetting : unit_access<double> {
    unit_access<double>& inner;
    explicit forgetting(unit_access<double>& i) : inner(i) {}
    std::span<const double> parameters(std::size_t u, std::size_t k) override { return inner.parameters(u, k); }
    std::span<double> gradients(std::size_t u, std::size_t k) override { return inner.gradients(u, k); }
    void forward_done(std::size_t u) override { inner.forward_done(u); }
    void backward_done(std::size_t u) override {
      if (u != 2) inner.backward_done(u);
    }
  };
  double forward_backward(const batch_type& batch, unit_access<double>& units) {
    forgetting f(units);
    return unit_linear_model::forward_backward(batch, f);
  }
};
}  // namespace

TEST_CASE("stage 3: a model that never finishes a unit's backward gets a clear error", "[sharded]") {
  std::vector<std::string> first(2), second(2);
  run_inproc(2, [&](int r, inproc_transport t) {
    auto data = data_of(r);
    forgetful m(unit_sizes, data, 0.25);
    sharded::trainer<comm_t, sharded::zero3, momentum<double>, forgetful> tr(comm_t(std::move(t)),
                                                                             momentum<double>(lr, mu), m);
    for (auto* message : {&first, &second}) {
      try {
        tr.step({0, batch});
      } catch (const error& e) {
        (*message)[static_cast<std::size_t>(r)] = e.what();
      }
    }
  });
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK(first[r].find("never called backward_done(2)") != std::string::npos);
    CHECK(second[r].find("an earlier step failed") != std::string::npos);
  }
}
