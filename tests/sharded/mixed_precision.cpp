// Mixed precision in the sharded trainer: 16-bit models with float master weights and state,
// against the serial mixed-precision simulation (mixed_models.hpp) and against fp64 training;
// dynamic loss scaling skipping exactly the steps whose gradients overflowed (injected and
// real), on every rank; scaling that changes no bit of a step that does not overflow; the
// scaler's state through a checkpoint; the trainer's bytes against ZeRO's formula; misuse.

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "../allreduce/linear_model.hpp"
#include "../allreduce/simulation.hpp"
#include "../catch.hpp"
#include "../support/files.hpp"
#include "dtrain/collective/communicator.hpp"
#include "dtrain/sharded/trainer.hpp"
#include "dtrain/sharded/unit_trainer.hpp"
#include "dtrain/transport/inproc.hpp"
#include "dtrain/updater/adam.hpp"
#include "dtrain/updater/momentum.hpp"
#include "mixed_checks.hpp"
#include "mixed_models.hpp"
#include "references.hpp"
#include "unit_model.hpp"

using namespace dtrain;
using namespace dtrain::testing;
using comm_t = ring<inproc_transport>;

namespace {

sharded::trainer_options buckets16() { return small_buckets16<sharded::trainer_options>(); }

template <class Stage, class T, class Updater>
std::vector<rank_run> train(const run_spec& spec, Updater updater, sharded::trainer_options options) {
  std::vector<rank_run> out(static_cast<std::size_t>(spec.p));
  run_inproc(spec.p, [&](int r, inproc_transport t) {
    rank_run& mine = out[static_cast<std::size_t>(r)];
    const auto data = data_of(r);
    auto run = [&](auto& tr, auto&& parameters) { record_steps(tr, spec, mine, parameters); };
    auto injected = [&](std::size_t pass) {
      return spec.overflow && spec.overflow(spec.first_step + static_cast<int>(pass), r);
    };
    if constexpr (std::same_as<Stage, sharded::zero3>) {
      using model_t = basic_unit_linear_model<T>;
      model_t m(unit_sizes, data, 0.25);
      m.overflow = [&](std::size_t pass, std::size_t u, std::size_t k) {  // a unit of its own per rank
        return u == static_cast<std::size_t>(r) % unit_sizes.size() && k == 0 && injected(pass);
      };
      m.on_scale = [&](double s) { mine.scales_seen.push_back(s); };
      sharded::trainer<comm_t, Stage, Updater, model_t> tr(comm_t(std::move(t)), updater, m, options);
      auto master = [&] {
        std::vector<double> all;
        for (std::size_t u = 0; u < unit_sizes.size(); ++u) {
          for (const auto v : tr.unit_parameters(u)) all.push_back(static_cast<double>(v));
        }
        return all;
      };
      run(tr, master);
      mine.master = master();
      for (const double v : mine.master) {
        mine.weights.push_back(element_cast<double>(element_cast<T>(static_cast<compute_type_t<T>>(v))));
      }
    } else {
      mixed_linear_model<T> m(data, r == 0 ? 0.25 : 1.0 + r);  // the broadcast must undo r's start
      inject_overflows(m, spec, r, mine);
      sharded::trainer<comm_t, Stage, Updater, mixed_linear_model<T>> tr(comm_t(std::move(t)), updater, m, options);
      run(tr, [&] { return m.weights(); });
      mine.weights = m.weights();
    }
  });
  return out;
}

}  // namespace

TEMPLATE_TEST_CASE("a 16-bit model with float master weights and state equals the serial mixed simulation",
                   "[sharded][mixed]", sharded::zero1, sharded::zero2, sharded::zero3) {
  for (const int p : {1, 3, 4}) {
    INFO("P = " << p);
    run_spec spec;
    spec.p = p;
    spec.steps = 30;
    require_matches<bfloat16>(train<TestType, bfloat16>(spec, adam<float>(1e-2), buckets16()),
                              mixed_training<bfloat16>(p, 30, adam<float>(1e-2)));
    require_matches<float16>(train<TestType, float16>(spec, adam<float>(1e-2), buckets16()),
                             mixed_training<float16>(p, 30, adam<float>(1e-2)));
  }
  // Adam's steps of 5e-4 are below half of bfloat16's spacing at 0.25 (2^-9): a master kept in
  // 16 bits would round every update away and never move.
  run_spec spec;
  spec.steps = 30;
  const auto slow = train<TestType, bfloat16>(spec, adam<float>(5e-4), buckets16());
  CHECK(std::count(slow[0].weights.begin(), slow[0].weights.end(), 0.25) < 10);
}

TEMPLATE_TEST_CASE("mixed precision stays within a stated bound of fp64 training, reducing in either precision",
                   "[sharded][mixed]", sharded::zero1, sharded::zero2, sharded::zero3) {
  // bf16 rounds each gradient and weight by up to 2^-9 relative, float16 by 2^-12. Measured
  // relative L2 distances after 40 steps, every stage and both reductions: bf16 1.6-1.8e-3,
  // float16 1.9-2.1e-4 (docs/sharded.md); the bounds are about 3x those.
  const std::vector<double> exact = serial_training(3, 40, adam<double>(1e-2));
  run_spec spec;
  spec.steps = 40;
  for (const auto precision : {sharded::reduce_precision::master, sharded::reduce_precision::model}) {
    INFO("reduce in " << (precision == sharded::reduce_precision::master ? "master" : "model"));
    sharded::trainer_options o = buckets16();
    o.reduce_in = precision;
    const double bf = distance(train<TestType, bfloat16>(spec, adam<float>(1e-2), o)[0].weights, exact);
    const double fp = distance(train<TestType, float16>(spec, adam<float>(1e-2), o)[0].weights, exact);
    CHECK(bf < 5e-3);
    CHECK(fp < 6e-4);
    CHECK(fp < bf);
  }
  // The two reductions round differently: `reduce_in` reaches the wire.
  sharded::trainer_options in_model = buckets16();
  in_model.reduce_in = sharded::reduce_precision::model;
  CHECK(train<TestType, bfloat16>(spec, adam<float>(1e-2), buckets16())[0].weights !=
        train<TestType, bfloat16>(spec, adam<float>(1e-2), in_model)[0].weights);
}

TEMPLATE_TEST_CASE("loss scaling skips exactly the steps whose gradients overflowed, on every rank",
                   "[sharded][mixed]", sharded::zero1, sharded::zero2, sharded::zero3) {
  sharded::trainer_options o = buckets16();
  o.scaling = small_scaling();
  check_skips_exactly_the_overflows([&](const run_spec& spec) {
    return train<TestType, float16>(spec, momentum<float>(1e-2), o);  // the overflows in one weight at stages 1, 2
  });
}

TEST_CASE("float16 gradients that really overflow are skipped until the scale is small enough", "[sharded][mixed]") {
  sharded::trainer_options o = buckets16();
  o.scaling = {true, 1048576.0, 2.0, 0.5, 1000};  // 2^20: gradients of ~1 overflow float16's 65504
  run_spec spec;
  spec.steps = 20;
  const auto want = mixed_training<float16>(3, 20, adam<float>(1e-2), o.scaling);
  const auto skips = std::count(want.skipped.begin(), want.skipped.end(), true);
  REQUIRE(skips >= 3);
  REQUIRE(skips <= 16);
  for (const auto& got : {train<sharded::zero2, float16>(spec, adam<float>(1e-2), o),
                          train<sharded::zero3, float16>(spec, adam<float>(1e-2), o)}) {
    for (const rank_run& r : got) CHECK(r.skipped == want.skipped);
    require_matches<float16>(got, want);
  }
}

TEMPLATE_TEST_CASE("scaling by powers of two changes no bit of a step that does not overflow", "[sharded][mixed]",
                   sharded::zero1, sharded::zero2, sharded::zero3) {
  sharded::trainer_options plain;
  plain.first_bucket_bytes = 8 * 10;
  sharded::trainer_options scaled = plain;
  scaled.scaling = {true, 1024.0, 2.0, 0.5, 2};  // the scale doubles every second step
  run_spec spec;
  const auto a = train<TestType, double>(spec, adam<double>(1e-2), plain);
  const auto b = train<TestType, double>(spec, adam<double>(1e-2), scaled);
  REQUIRE(b[0].scales == std::vector<double>{1024, 1024, 2048, 2048, 4096, 4096, 8192, 8192, 16384, 16384, 32768,
                                             32768});
  CHECK(b[0].scales_seen == b[0].scales);  // the model did scale its loss
  CHECK(a[0].scales_seen.empty());
  for (std::size_t r = 0; r < a.size(); ++r) CHECK(a[r].weights == b[r].weights);
}

TEMPLATE_TEST_CASE("the loss scale and its count come back from a checkpoint, and the job goes on bit for bit",
                   "[sharded][mixed]", sharded::zero1, sharded::zero2, sharded::zero3) {
  temp_dir dir;
  sharded::trainer_options o = buckets16();
  o.scaling = small_scaling();
  check_resumes_bit_for_bit(dir.path + "/job", [&](const run_spec& spec) {
    return train<TestType, float16>(spec, adam<float>(1e-2), o);
  });
}

TEST_CASE("a bf16 Adam shard holds ZeRO's 16/P bytes per parameter, besides its 16-bit buffers", "[sharded][mixed]") {
  // ZeRO's mixed-precision Adam: float master (4), gradient slice (4) and two moments (8) per
  // parameter, over P; the model's own 16-bit weights and gradients are the model's.
  for (const auto precision : {sharded::reduce_precision::master, sharded::reduce_precision::model}) {
    std::vector<sharded::memory_use> now(4), peak(4);
    std::vector<std::size_t> state_bytes(4);
    run_inproc(4, [&](int r, inproc_transport t) {
      const auto data = data_of(r);
      mixed_linear_model<bfloat16> m(data, 0.25);
      sharded::trainer_options o;  // one bucket of 130, padded to 132: slices of 33
      o.reduce_in = precision;
      o.scaling.enabled = true;
      sharded::trainer<comm_t, sharded::zero2, adam<float>, mixed_linear_model<bfloat16>> tr(comm_t(std::move(t)),
                                                                                           adam<float>(), m, o);
      for (std::size_t k = 0; k < 3; ++k) tr.step({k * batch, (k + 1) * batch});
      const auto i = static_cast<std::size_t>(r);
      now[i] = tr.memory();
      peak[i] = tr.peak_memory();
      state_bytes[i] = tr.updater().state().size() * sizeof(float);
    });
    for (std::size_t r = 0; r < 4; ++r) {
      CHECK(now[r].parameters == 33 * 4);
      CHECK(now[r].gradients == 33 * 4);
      CHECK(now[r].optimizer_state == 33 * 8);
      CHECK(state_bytes[r] == 33 * 8);  // what the updater holds, not only what the trainer says
      // A padded bucket in 16 bits for the gathers, and one to reduce in: in float, or a 16-bit slice.
      CHECK(now[r].buffers == (precision == sharded::reduce_precision::master ? 132 * 2 + 132 * 4 : 132 * 2 + 33 * 2));
      CHECK(peak[r].total() == now[r].total());  // allocated once, at construction
    }
  }
}

TEST_CASE("loss scaling refuses a model that cannot scale its loss, and options out of range", "[sharded][mixed]") {
  std::vector<std::string> errors(2);
  run_inproc(2, [&](int r, inproc_transport t) {
    const auto data = data_of(r);
    linear_model m(tensor_sizes, data, 0.25);
    sharded::trainer_options o;
    o.scaling.enabled = true;
    try {
      sharded::trainer<comm_t, sharded::zero2, adam<double>, linear_model> tr(comm_t(std::move(t)), adam<double>(), m,
                                                                              o);
    } catch (const error& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  for (const std::string& e : errors) CHECK(e.find("the model has no set_loss_scale(double)") != std::string::npos);
  CHECK_THROWS_WITH(loss_scaler({true, 0.0}), Catch::Contains("initial_scale"));
  CHECK_THROWS_WITH(loss_scaler({true, 1024.0, 1.0}), Catch::Contains("growth_factor"));
  CHECK_THROWS_WITH(loss_scaler({true, 1024.0, 2.0, 1.0}), Catch::Contains("backoff_factor"));
  CHECK_THROWS_WITH(loss_scaler({true, 1024.0, 2.0, 0.5, 0}), Catch::Contains("growth_interval"));
}

TEST_CASE("ranks that differ in precision or scaling fail at start-up, all of them", "[sharded][mixed]") {
  for (const bool differ_in_scaling : {false, true}) {
    std::vector<std::string> errors(3);
    run_inproc(3, [&](int r, inproc_transport t) {
      const auto data = data_of(r);
      mixed_linear_model<bfloat16> m(data, 0.25);
      sharded::trainer_options o;
      if (r == 1 && differ_in_scaling) o.scaling.enabled = true;
      if (r == 1 && !differ_in_scaling) o.reduce_in = sharded::reduce_precision::model;
      try {
        sharded::trainer<comm_t, sharded::zero2, adam<float>, mixed_linear_model<bfloat16>> tr(comm_t(std::move(t)),
                                                                                             adam<float>(), m, o);
      } catch (const error& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
    for (const std::string& e : errors) {
      CHECK(e.find("ranks disagree on") != std::string::npos);
      CHECK(e.find(differ_in_scaling ? "scaling.enabled: rank 0 has false, rank 1 has true"
                                     : "reduce_in: rank 0 has master, rank 1 has model") != std::string::npos);
    }
  }
}
