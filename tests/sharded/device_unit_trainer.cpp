// ZeRO stage 3 on Thrust's device memory (`sharded::device_trainer<..., zero3, ...>`) under
// Thrust's CPP system, where device memory is host memory: the code a CUDA build runs on the GPU,
// checked against the serial simulation and, bit for bit, against the host stage-3 trainer over
// the same staged collective (double, and 16-bit models in mixed precision with loss scaling);
// its checkpoints against an uninterrupted run and the host trainer's sets; its memory against
// the host trainer's accounting.

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "../allreduce/checks.hpp"  // require_close
#include "../allreduce/simulation.hpp"
#include "../catch.hpp"
#include "../support/files.hpp"
#include "mixed_checks.hpp"
#include "references.hpp"
#include "unit_model.hpp"
#include "dtrain/collective/staged.hpp"
#include "dtrain/sharded/device_trainer.hpp"
#include "dtrain/sharded/unit_trainer.hpp"
#include "dtrain/transport/inproc.hpp"
#include "dtrain/updater/adam.hpp"
#include "dtrain/updater/momentum.hpp"

using namespace dtrain;
using namespace dtrain::testing;
using staged_t = staged_communicator<inproc_transport>;

namespace {

// The test unit model with the stream a device model names.
template <class T>
struct device_unit_model : basic_unit_linear_model<T> {
  using basic_unit_linear_model<T>::basic_unit_linear_model;
  detail::thrust_space::stream_handle stream() const noexcept { return {}; }
};
static_assert(sharded::device_unit_model<device_unit_model<double>>);
static_assert(sharded::device_unit_model<device_unit_model<bfloat16>>);

struct unit_run {
  std::vector<rank_run> ranks;
  std::vector<memory_use> now, peak;
};

// `spec` on the device trainer (or, `device` false, the host one) at stage 3 over staged ranks:
// every rank's steps, its master weights (every unit gathered), and its memory.
template <class T, class Updater>
unit_run train(bool device, const run_spec& spec, Updater updater, sharded::trainer_options options = {},
               std::size_t skip_gradients = static_cast<std::size_t>(-1)) {
  const auto P = static_cast<std::size_t>(spec.p);
  unit_run out{std::vector<rank_run>(P), std::vector<memory_use>(P), std::vector<memory_use>(P)};
  run_inproc(spec.p, [&](int r, inproc_transport t) {
    const auto R = static_cast<std::size_t>(r);
    rank_run& mine = out.ranks[R];
    const auto data = data_of(r);
    device_unit_model<T> m(unit_sizes, data, r == 0 ? 0.25 : 1.0 + r);  // the root's start must win
    m.overflow = [&](std::size_t pass, std::size_t u, std::size_t k) {  // a unit of its own per rank
      return u == R % unit_sizes.size() && k == 0 && spec.overflow &&
             spec.overflow(spec.first_step + static_cast<int>(pass), r);
    };
    m.on_scale = [&](double s) { mine.scales_seen.push_back(s); };
    m.skip_gradients = skip_gradients;
    auto go = [&](auto& tr) {
      auto master = [&] {
        std::vector<double> all;
        for (std::size_t u = 0; u < unit_sizes.size(); ++u) {
          for (const auto v : tr.unit_parameters(u)) all.push_back(static_cast<double>(v));
        }
        return all;
      };
      record_steps(tr, spec, mine, master);
      mine.weights = master();
      out.now[R] = tr.memory();
      out.peak[R] = tr.peak_memory();
    };
    if (device) {
      sharded::device_trainer<staged_t, sharded::zero3, Updater, device_unit_model<T>> tr(staged_t(std::move(t)),
                                                                                           updater, m, options);
      go(tr);
    } else {
      sharded::trainer<staged_t, sharded::zero3, Updater, basic_unit_linear_model<T>> tr(staged_t(std::move(t)),
                                                                                         updater, m, options);
      go(tr);
    }
  });
  return out;
}

std::vector<std::vector<double>> weights(const unit_run& run) {
  std::vector<std::vector<double>> out;
  for (const rank_run& r : run.ranks) out.push_back(r.weights);
  return out;
}

}  // namespace

TEST_CASE("sharded device trainer, stage 3: the serial simulation, and the host trainer's bits", "[sharded][device]") {
  for (const int p : {1, 2, 3, 5}) {
    for (const std::size_t limit : {1, 2}) {
      INFO("ranks " << p << ", limit_all_gathers " << limit);
      run_spec spec;
      spec.p = p;
      spec.steps = 30;
      sharded::trainer_options o;
      o.limit_all_gathers = limit;
      const auto got = weights(train<double>(true, spec, momentum<double>(lr, mu), o));
      require_close(got[0], simulate(p, 30, 1, 0)[0], 1e-12);
      for (const auto& w : got) REQUIRE(w == got[0]);
      REQUIRE(got == weights(train<double>(false, spec, momentum<double>(lr, mu), o)));
    }
  }
  run_spec spec;
  spec.p = 3;
  spec.steps = 25;
  require_close(weights(train<double>(true, spec, adam<double>(0.01)))[0], serial_training(3, 25, adam<double>(0.01)),
                1e-12);
}

TEMPLATE_TEST_CASE("sharded device trainer, stage 3: 16-bit models with float master weights, loss scaled",
                   "[sharded][device][mixed]", bfloat16, float16) {
  run_spec spec;
  spec.steps = 12;
  spec.overflow = [](int k, int r) { return (k == 2 && r == 0) || (k == 5 && r != 0); };
  for (const auto precision : {sharded::reduce_precision::master, sharded::reduce_precision::model}) {
    INFO((precision == sharded::reduce_precision::master ? "reduced in float" : "reduced in 16 bits"));
    sharded::trainer_options o;
    o.reduce_in = precision;
    o.scaling = small_scaling();
    const unit_run device = train<TestType>(true, spec, adam<float>(1e-2), o);
    const unit_run host = train<TestType>(false, spec, adam<float>(1e-2), o);
    for (std::size_t r = 0; r < device.ranks.size(); ++r) {
      const rank_run &d = device.ranks[r], &h = host.ranks[r];
      CHECK(d.weights == h.weights);
      CHECK(d.weights == device.ranks[0].weights);
      CHECK(d.skipped == std::vector<bool>{false, false, true, false, false, true, false, false, false, false, false,
                                           false});
      CHECK(d.scales == h.scales);
      CHECK(d.scales_seen == d.scales);
      CHECK(d.skipped_changed == 0);
    }
  }
}

TEST_CASE("sharded device trainer, stage 3: the host trainer's accounting, in device memory under CUDA",
          "[sharded][device]") {
  run_spec spec;
  spec.p = 3;
  spec.steps = 4;
  sharded::trainer_options o;
  o.limit_all_gathers = 1;
  const unit_run device = train<bfloat16>(true, spec, adam<float>(1e-2), o);
  const unit_run host = train<bfloat16>(false, spec, adam<float>(1e-2), o);
  for (std::size_t r = 0; r < 3; ++r) {
    INFO("rank " << r);
    // Slices of 15 + 6 + 20 + 3 = 44 values: float master, gradient, two moments.
    CHECK(device.now[r].parameters == 44 * 4);
    CHECK(device.now[r].optimizer_state == 2 * 44 * 4);
    CHECK(device.now[r].gathered == 0);
    const memory_use &d = device.now[r], &h = host.now[r];
    CHECK(d.parameters == h.parameters);
    CHECK(d.gradients == h.gradients);
    CHECK(d.optimizer_state == h.optimizer_state);
    CHECK(d.unit_gradients == 0);
    CHECK(d.device == (THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA ? d.total() : 0));
    CHECK(device.peak[r].gathered == 60 * 2);  // one unit at a time, the largest in bfloat16
    CHECK(device.peak[r].gathered == host.peak[r].gathered);
    // The largest unit's bf16 gradients and their float copy for the reduction (reduce_in master).
    CHECK(device.peak[r].unit_gradients == 60 * 2 + 60 * 4);
    CHECK(device.peak[r].unit_gradients == host.peak[r].unit_gradients);
  }
}

TEST_CASE("sharded device trainer, stage 3: a job resumed from its set continues bit for bit, re-sharded on the host",
          "[sharded][device][checkpoint]") {
  temp_dir dir;
  const std::string a = dir.path + "/a", b = dir.path + "/b";
  sharded::trainer_options o;
  o.scaling = small_scaling();
  run_spec whole;
  whole.p = 2;
  whole.steps = 10;
  whole.overflow = [](int k, int r) { return k == 2 && r == 0; };
  const auto straight = train<float16>(true, whole, adam<float>(1e-2), o);
  run_spec first = whole, second = whole, through = whole;
  first.steps = 5;
  first.save = a;
  second.first_step = 5;
  second.steps = 5;
  second.load = a;
  train<float16>(true, first, adam<float>(1e-2), o);
  const auto resumed = train<float16>(true, second, adam<float>(1e-2), o);
  for (std::size_t r = 0; r < 2; ++r) {
    CHECK(resumed.ranks[r].weights == straight.ranks[r].weights);
    CHECK(resumed.ranks[r].scales ==
          std::vector<double>(straight.ranks[r].scales.begin() + 5, straight.ranks[r].scales.end()));
  }
  // 3 host ranks load the device's set and save it in their cut; the device job goes on from it.
  through.p = 3;
  through.first_step = 5;
  through.steps = 0;
  through.load = a;
  through.save = b;
  train<float16>(false, through, adam<float>(1e-2), o);
  second.load = b;
  const auto back = train<float16>(true, second, adam<float>(1e-2), o);
  for (std::size_t r = 0; r < 2; ++r) {
    CHECK(back.ranks[r].weights == straight.ranks[r].weights);
    const auto& all = straight.ranks[r].scales;
    CHECK(back.ranks[r].scales == std::vector<double>(all.begin() + 5, all.end()));
  }
}

TEST_CASE("sharded device trainer, stage 3: a unit whose gradients the model never asked for is reduced as zeros",
          "[sharded][device]") {
  run_spec spec;
  spec.steps = 6;
  const auto device = train<double>(true, spec, momentum<double>(lr, mu), {}, 1);
  REQUIRE(device.ranks[0].weights == train<double>(false, spec, momentum<double>(lr, mu), {}, 1).ranks[0].weights);
  // Unit 1 (features 43-60) never moves from the start; the others do.
  const std::vector<double>& w = device.ranks[0].weights;
  for (std::size_t j = 43; j < 61; ++j) REQUIRE(w[j] == 0.25);
  CHECK(std::count(w.begin(), w.end(), 0.25) == 18);
}
