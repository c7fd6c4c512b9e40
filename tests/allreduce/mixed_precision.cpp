// Mixed precision in the allreduce trainer: 16-bit models with float master weights and state
// (mixed_backend.hpp), against the serial mixed-precision simulation (../sharded/mixed_models.hpp)
// and fp64 training; dynamic loss scaling skipping exactly the steps whose gradients overflowed,
// injected and real, on every rank; the master copy and the scaler through a checkpoint; misuse.

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "../catch.hpp"
#include "../sharded/mixed_checks.hpp"
#include "../sharded/mixed_models.hpp"
#include "../sharded/references.hpp"
#include "../support/files.hpp"
#include "dtrain/allreduce/trainer.hpp"
#include "dtrain/collective/communicator.hpp"
#include "dtrain/transport/inproc.hpp"
#include "dtrain/updater/adam.hpp"
#include "dtrain/updater/momentum.hpp"
#include "linear_model.hpp"
#include "simulation.hpp"

using namespace dtrain;
using namespace dtrain::testing;
using comm_t = ring<inproc_transport>;

namespace {

allreduce::trainer_options buckets16() { return small_buckets16<allreduce::trainer_options>(); }

// `spec.p` ranks train a mixed_linear_model<T> from `spec.first_step` (loading first, saving
// after, when asked).
template <class T, class Updater>
std::vector<rank_run> train(const run_spec& spec, Updater updater, allreduce::trainer_options options) {
  std::vector<rank_run> out(static_cast<std::size_t>(spec.p));
  run_inproc(spec.p, [&](int r, inproc_transport t) {
    rank_run& mine = out[static_cast<std::size_t>(r)];
    const auto data = data_of(r);
    mixed_linear_model<T> m(data, r == 0 ? 0.25 : 1.0 + r);  // the broadcast must undo r's start
    inject_overflows(m, spec, r, mine);
    allreduce::trainer tr(comm_t(std::move(t)), updater, m, options);
    if (!spec.load.empty()) tr.load(spec.load);
    for (int k = spec.first_step; k < spec.first_step + spec.steps; ++k) {
      const std::size_t begin = (static_cast<std::size_t>(k) * batch) % 400;
      const std::vector<double> before = m.weights();
      const std::vector<float> state(tr.updater().state().begin(), tr.updater().state().end());
      const std::size_t updates = tr.steps();
      const allreduce::step_result res = tr.step({begin, begin + batch});
      mine.skipped.push_back(res.skipped);
      mine.scales.push_back(res.loss_scale);
      const bool same_state = std::equal(state.begin(), state.end(), tr.updater().state().begin());
      if (res.skipped && (m.weights() != before || !same_state || tr.steps() != updates)) ++mine.skipped_changed;
    }
    mine.updates = tr.steps();
    mine.weights = m.weights();
    if (!spec.save.empty() && r == 0) tr.save(spec.save);  // synchronous: rank 0's file is every rank's
  });
  return out;
}

}  // namespace

TEST_CASE("allreduce: a 16-bit model with float master weights and state equals the serial mixed simulation",
          "[allreduce][mixed]") {
  for (const int p : {1, 3, 4}) {
    INFO("P = " << p);
    run_spec spec;
    spec.p = p;
    spec.steps = 30;
    require_matches<bfloat16>(train<bfloat16>(spec, adam<float>(1e-2), buckets16()),
                              mixed_training<bfloat16>(p, 30, adam<float>(1e-2)));
    require_matches<float16>(train<float16>(spec, adam<float>(1e-2), buckets16()),
                             mixed_training<float16>(p, 30, adam<float>(1e-2)));
  }
  // Adam's steps of 5e-4 are below half of bfloat16's spacing at 0.25 (2^-9): a master kept in
  // 16 bits would round every update away and never move.
  run_spec spec;
  spec.steps = 30;
  const auto slow = train<bfloat16>(spec, adam<float>(5e-4), buckets16());
  for (const rank_run& r : slow) CHECK(r.weights == slow[0].weights);
  CHECK(std::count(slow[0].weights.begin(), slow[0].weights.end(), 0.25) < 10);
  // Two ranks: a float sum of two is the same in either order, so averaging in the master
  // precision must give the simulation's master rounded, exactly (reducing in 16 bits does not).
  run_spec two;
  two.p = 2;
  two.steps = 30;
  for (const auto precision : {reduce_precision::master, reduce_precision::model}) {
    allreduce::trainer_options o = buckets16();
    o.reduce_in = precision;
    const auto got = train<bfloat16>(two, adam<float>(1e-2), o);
    const auto want = mixed_training<bfloat16>(2, 30, adam<float>(1e-2)).master;
    std::size_t equal = 0;
    for (std::size_t j = 0; j < want.size(); ++j) {
      equal += got[0].weights[j] == element_cast<double>(element_cast<bfloat16>(want[j]));
    }
    if (precision == reduce_precision::master) {
      CHECK(equal == want.size());
    } else {
      CHECK(equal < want.size());
    }
  }
}

TEST_CASE("allreduce: mixed precision stays within a stated bound of fp64 training, reducing in either precision",
          "[allreduce][mixed]") {
  // The sharded trainers' bounds (docs/sharded.md: measured bf16 1.6-1.8e-3, float16 1.9-2.1e-4).
  const std::vector<double> exact = serial_training(3, 40, adam<double>(1e-2));
  run_spec spec;
  spec.steps = 40;
  for (const auto precision : {reduce_precision::master, reduce_precision::model}) {
    INFO("reduce in " << (precision == reduce_precision::master ? "master" : "model"));
    allreduce::trainer_options o = buckets16();
    o.reduce_in = precision;
    const auto bf16_run = train<bfloat16>(spec, adam<float>(1e-2), o);
    const auto fp16_run = train<float16>(spec, adam<float>(1e-2), o);
    for (const rank_run& r : bf16_run) CHECK(r.weights == bf16_run[0].weights);
    for (const rank_run& r : fp16_run) CHECK(r.weights == fp16_run[0].weights);
    const double bf = distance(bf16_run[0].weights, exact);
    const double fp = distance(fp16_run[0].weights, exact);
    CHECK(bf < 5e-3);
    CHECK(fp < 6e-4);
    CHECK(fp < bf);
  }
  allreduce::trainer_options in_model = buckets16();  // the two round differently: reduce_in reaches the wire
  in_model.reduce_in = reduce_precision::model;
  CHECK(train<bfloat16>(spec, adam<float>(1e-2), buckets16())[0].weights !=
        train<bfloat16>(spec, adam<float>(1e-2), in_model)[0].weights);
}

TEST_CASE("allreduce: loss scaling skips exactly the steps whose gradients overflowed, on every rank",
          "[allreduce][mixed]") {
  allreduce::trainer_options o = buckets16();
  o.scaling = small_scaling();
  check_skips_exactly_the_overflows([&](const run_spec& spec) {
    return train<float16>(spec, momentum<float>(1e-2), o);
  });
}

TEST_CASE("allreduce: float16 gradients that really overflow are skipped until the scale is small enough",
          "[allreduce][mixed]") {
  allreduce::trainer_options o = buckets16();
  o.scaling = {true, 1048576.0, 2.0, 0.5, 1000};  // 2^20: gradients of ~1 overflow float16's 65504
  run_spec spec;
  spec.steps = 20;
  const auto want = mixed_training<float16>(3, 20, adam<float>(1e-2), o.scaling);
  const auto skips = std::count(want.skipped.begin(), want.skipped.end(), true);
  REQUIRE(skips >= 3);
  REQUIRE(skips <= 16);
  const auto got = train<float16>(spec, adam<float>(1e-2), o);
  for (const rank_run& r : got) CHECK(r.skipped == want.skipped);
  require_matches<float16>(got, want);
}

TEST_CASE("allreduce: the master weights, the loss scale and its count come back from a checkpoint, bit for bit",
          "[allreduce][mixed]") {
  temp_dir dir;
  allreduce::trainer_options o = buckets16();
  o.scaling = small_scaling();
  // Adam's steps of 5e-4 round away in bfloat16 alone: resuming from the rounded weights, not the
  // float master, would go on from another point.
  check_resumes_bit_for_bit(dir.path + "/rank0", [&](const run_spec& spec) {
    return train<bfloat16>(spec, adam<float>(5e-4), o);
  });
}

TEST_CASE("allreduce: mixed precision refuses what it does not do, on every rank, naming it", "[allreduce][mixed]") {
  auto errors_of = [](auto&& build) {
    std::vector<std::string> errors(2);
    run_inproc(2, [&](int r, inproc_transport t) {
      try {
        build(r, comm_t(std::move(t)));
      } catch (const error& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
    return errors;
  };
  auto mixed = [](allreduce::trainer_options o) {
    return [o](int r, comm_t c) {
      const auto data = data_of(r);
      mixed_linear_model<bfloat16> m(data, 0.25);
      allreduce::trainer tr(std::move(c), adam<float>(), m, o);
      tr.accumulate({0, batch});
    };
  };
  allreduce::trainer_options local_sgd, compressed, clipped;
  local_sgd.average_every = 4;
  clipped.clip_grad_norm = 1.0;
  for (const std::string& e : errors_of(mixed(clipped))) CHECK(e.find("clip_grad_norm") != std::string::npos);
  compressed.compress = allreduce::compression::bf16;
  for (const std::string& e : errors_of(mixed(local_sgd))) CHECK(e.find("local SGD") != std::string::npos);
  for (const std::string& e : errors_of(mixed(compressed))) {
    CHECK(e.find("compression is for float") != std::string::npos);
  }
  for (const std::string& e : errors_of(mixed({}))) CHECK(e.find("gradient accumulation") != std::string::npos);
  // Ranks that average in different precisions would mix the two: refused at construction.
  const auto disagree = errors_of([](int r, comm_t c) {
    allreduce::trainer_options o;
    o.reduce_in = r == 0 ? reduce_precision::master : reduce_precision::model;
    const auto data = data_of(r);
    mixed_linear_model<bfloat16> m(data, 0.25);
    allreduce::trainer tr(std::move(c), adam<float>(), m, o);
  });
  for (const std::string& e : disagree) {
    CHECK(e.find("ranks disagree on the model or trainer options") != std::string::npos);
    CHECK(e.find("reduce_in: rank 0 has master, rank 1 has model") != std::string::npos);  // by name, both values
  }
  const auto float_model = errors_of([](int r, comm_t c) {
    allreduce::trainer_options o;
    o.scaling.enabled = true;
    const auto data = data_of(r);
    linear_model m(tensor_sizes, data, 0.25);
    allreduce::trainer tr(std::move(c), adam<double>(), m, o);
  });
  for (const std::string& e : float_model) CHECK(e.find("loss scaling is for 16-bit models") != std::string::npos);
}

TEST_CASE("allreduce: a bf16 model's trainer holds a float master copy, gradient and Adam state, and no unused "
          "buffer", "[allreduce][mixed]") {
  // 130 parameters in one bucket (default options), Adam: master 4 + gradient 4 + moments 8 bytes
  // per parameter; the bucket packed in bf16 (2), and widened to float (4) only when it is
  // reduced in the master precision.
  constexpr std::size_t n = 130;
  for (const auto precision : {reduce_precision::master, reduce_precision::model}) {
    std::vector<memory_use> now(3), peak(3);
    run_inproc(3, [&](int r, inproc_transport t) {
      const auto data = data_of(r);
      mixed_linear_model<bfloat16> m(data, 0.25);
      allreduce::trainer_options o;
      o.reduce_in = precision;
      allreduce::trainer tr(comm_t(std::move(t)), adam<float>(1e-2), m, o);
      for (std::size_t k = 0; k < 3; ++k) tr.step({k * batch, (k + 1) * batch});
      now[static_cast<std::size_t>(r)] = tr.memory();
      peak[static_cast<std::size_t>(r)] = tr.peak_memory();
    });
    for (std::size_t r = 0; r < 3; ++r) {
      CHECK(now[r].parameters == n * 4);
      CHECK(now[r].gradients == n * 4);
      CHECK(now[r].optimizer_state == n * 8);
      CHECK(now[r].buffers == (precision == reduce_precision::master ? n * 2 + n * 4 : n * 2));
      CHECK(peak[r].total() == now[r].total());  // allocated once, at construction
    }
  }
}
