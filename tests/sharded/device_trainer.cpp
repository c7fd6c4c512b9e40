// The sharded device trainer (ZeRO stages 1 and 2 on Thrust's device memory) under Thrust's CPP
// system, where device memory is host memory: the code a CUDA build runs on the GPU, checked
// against the same serial references as the host sharded trainer, and against that trainer.

#include <cstddef>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "../allreduce/checks.hpp"  // require_close, small_buckets
#include "../allreduce/device_linear_model.hpp"
#include "../allreduce/simulation.hpp"
#include "../catch.hpp"
#include "references.hpp"
#include "dtrain/collective/communicator.hpp"
#include "dtrain/collective/staged.hpp"
#include "dtrain/sharded/device_trainer.hpp"
#include "dtrain/sharded/trainer.hpp"
#include "dtrain/transport/inproc.hpp"
#include "dtrain/updater/adagrad.hpp"
#include "dtrain/updater/adam.hpp"
#include "dtrain/updater/ftrl.hpp"
#include "dtrain/updater/momentum.hpp"
#include "dtrain/updater/rmsprop.hpp"

using namespace dtrain;
using namespace dtrain::testing;
using staged_t = staged_communicator<inproc_transport>;

namespace {

// Several buckets, most of them not a multiple of P long.
sharded::trainer_options sharded_buckets() { return small_buckets<sharded::trainer_options>(); }

// Every rank's weights after `steps` steps of the device trainer (`device`) or the host one.
template <class Stage, class Updater>
std::vector<std::vector<double>> train(bool device, int p, int steps, Updater updater, bool gaps = false) {
  std::vector<std::vector<double>> out(static_cast<std::size_t>(p));
  run_inproc(p, [&](int r, inproc_transport t) {
    auto data = data_of(r);
    device_linear_model m(tensor_sizes, data, r == 0 ? 0.25 : 1.0 + r, gaps);  // the broadcast must undo r's start
    auto run = [&](auto& tr) {
      for (int k = 0; k < steps; ++k) {
        const std::size_t begin = (static_cast<std::size_t>(k) * batch) % 400;
        tr.step({begin, begin + batch});
      }
    };
    if (device) {
      sharded::device_trainer<staged_t, Stage, Updater, device_linear_model> tr(staged_t(std::move(t)), updater, m,
                                                                                sharded_buckets());
      run(tr);
    } else {
      using ring_t = ring<inproc_transport>;
      sharded::trainer<ring_t, Stage, Updater, linear_model> tr(ring_t(std::move(t)), updater, m, sharded_buckets());
      run(tr);
    }
    out[static_cast<std::size_t>(r)] = m.weights();
  });
  return out;
}

}  // namespace

TEMPLATE_TEST_CASE("sharded device trainer equals the serial simulation, replicas bit-identical", "[sharded][device]",
                   sharded::zero1, sharded::zero2) {
  for (int p : {1, 2, 3, 5, 8}) {
    for (bool gaps : {false, true}) {
      INFO("ranks " << p << (gaps ? ", tensors apart" : ""));
      const auto got = train<TestType>(true, p, 30, momentum<double>(lr, mu), gaps);
      require_close(got[0], simulate(p, 30, 1, 0)[0], 1e-12);
      for (const auto& w : got) REQUIRE(w == got[0]);
      require_close(got[0], train<TestType>(false, p, 30, momentum<double>(lr, mu), gaps)[0], 1e-13);
    }
  }
}

TEMPLATE_TEST_CASE("sharded device Adam, Adagrad, RMSProp and FTRL equal one updater over the whole model",
                   "[sharded][device]", sharded::zero1, sharded::zero2) {
  for (int p : {2, 3, 5}) {
    INFO("ranks " << p);
    const auto got = train<TestType>(true, p, 25, adam<double>(0.01));
    require_close(got[0], serial_training(p, 25, adam<double>(0.01)), 1e-12);
    for (const auto& w : got) REQUIRE(w == got[0]);
    require_close(train<TestType>(true, p, 25, adagrad<double>(0.05))[0],
                  serial_training(p, 25, adagrad<double>(0.05)), 1e-12);
    require_close(train<TestType>(true, p, 25, rmsprop<double>(0.01))[0],
                  serial_training(p, 25, rmsprop<double>(0.01)), 1e-12);
    const ftrl<double> proximal(0.5, 1.0, 0.01, 0.01);
    require_close(train<TestType>(true, p, 25, proximal)[0], serial_training(p, 25, proximal), 1e-12);
  }
}

TEST_CASE("sharded device trainer: each rank's state and gradient are its slice, in device memory under CUDA",
          "[sharded][device]") {
  // 130 doubles in buckets of 69 and 61 (sharded_buckets): a rank's slices are ceil(69 / P) +
  // ceil(61 / P) values, Adam keeps two per value, and the buffer is the larger bucket padded.
  const std::size_t d = sizeof(double);
  const std::size_t slices[] = {0, 130, 66, 44, 34}, buffer[] = {0, 69, 70, 69, 72};
  for (int p : {1, 2, 3, 4}) {
    INFO("ranks " << p);
    const auto P = static_cast<std::size_t>(p);
    std::vector<memory_use> held(P);
    run_inproc(p, [&](int r, inproc_transport t) {
      auto data = data_of(r);
      device_linear_model m(tensor_sizes, data, 0.25);
      sharded::device_trainer<staged_t, sharded::zero2, adam<double>, device_linear_model> tr(
          staged_t(std::move(t)), adam<double>(), m, sharded_buckets());
      tr.step({0, batch});
      held[static_cast<std::size_t>(r)] = tr.memory();
    });
    for (const memory_use& m : held) {
      CHECK(m.parameters == slices[p] * d);
      CHECK(m.gradients == slices[p] * d);
      CHECK(m.optimizer_state == 2 * slices[p] * d);
      CHECK(m.buffers == buffer[p] * d);
      CHECK(m.device == (THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA ? m.total() : 0));
    }
  }
}

namespace {
// A device model that could scale its loss: the trainer must still refuse scaling on the device.
struct scalable_device_model : device_linear_model {
  using device_linear_model::device_linear_model;
  void set_loss_scale(double) {}
};
}  // namespace

TEST_CASE("sharded device trainer: mismatched models fail on every rank, checkpoints and scaling are refused",
          "[sharded][device]") {
  std::vector<std::string> errors(2);
  run_inproc(2, [&](int r, inproc_transport t) {
    auto data = data_of(r);
    std::vector<std::size_t> sizes = tensor_sizes;
    if (r == 1) sizes.back() += 1;
    device_linear_model m(sizes, data, 0.25);
    try {
      sharded::device_trainer<staged_t, sharded::zero1, adam<double>, device_linear_model> tr(staged_t(std::move(t)),
                                                                                               adam<double>(), m);
    } catch (const error& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  for (const auto& e : errors) {
    CHECK(e.find("sharded::device_trainer<zero1>: ranks disagree on the model") != std::string::npos);
    CHECK(e.find("rank 1 has 6 tensors, 131 elements") != std::string::npos);
  }

  // Per rank: what save, load and a trainer with loss scaling raised (code, text).
  std::vector<std::vector<std::pair<std::error_code, std::string>>> refused(2);
  auto attempt = [](auto&& f) {
    try {
      f();
    } catch (const error& e) {
      return std::make_pair(e.code(), e.reason());
    }
    return std::make_pair(std::error_code(), std::string("no error"));
  };
  run_inproc(2, [&](int r, inproc_transport t) {
    auto data = data_of(r);
    device_linear_model m(tensor_sizes, data, 0.25);
    sharded::device_trainer<staged_t, sharded::zero2, adam<double>, device_linear_model> tr(staged_t(std::move(t)),
                                                                                             adam<double>(), m);
    auto& mine = refused[static_cast<std::size_t>(r)];
    mine.push_back(attempt([&] { tr.save("/nonexistent/never-written"); }));
    mine.push_back(attempt([&] { tr.load("/nonexistent/never-read"); }));
  });
  run_inproc(1, [&](int, inproc_transport t) {
    auto data = data_of(0);
    scalable_device_model m(tensor_sizes, data, 0.25);
    sharded::trainer_options o;
    o.scaling.enabled = true;
    refused[0].push_back(attempt([&] {
      sharded::device_trainer<staged_t, sharded::zero1, adam<double>, scalable_device_model> tr(
          staged_t(std::move(t)), adam<double>(), m, o);
    }));
  });
  const std::string checkpoints = "sharded::device_trainer<zero2>: checkpoints are host-only so far";
  for (const auto& mine : refused) {
    CHECK(mine[0] == std::make_pair(make_error_code(errc::unsupported), checkpoints));
    CHECK(mine[1] == std::make_pair(make_error_code(errc::unsupported), checkpoints));
  }
  REQUIRE(refused[0].size() == 3);
  CHECK(refused[0][2].first == make_error_code(errc::unsupported));
  CHECK(refused[0][2].second.find("sharded::device_trainer<zero1>: loss scaling is host-only") == 0);
}
