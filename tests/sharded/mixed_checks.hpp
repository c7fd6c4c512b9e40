// What the mixed-precision tests of every trainer record and check (tests/sharded/ and
// tests/allreduce/mixed_precision.cpp): each rank's run, and its weights against the serial
// mixed-precision simulation (mixed_models.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "../catch.hpp"
#include "dtrain/core/element.hpp"
#include "dtrain/updater/loss_scaler.hpp"
#include "dtrain/updater/momentum.hpp"
#include "mixed_models.hpp"

namespace dtrain::testing {

// The spacing of T's values relative to their size: a float that rounds to T moves by at most this.
template <class T>
constexpr double spacing() {
  if constexpr (std::same_as<T, bfloat16>) return 1.0 / 128;
  if constexpr (std::same_as<T, float16>) return 1.0 / 1024;
  return 0;
}

// What one rank saw: the model's weights after the run (stage 3: its master parameters rounded
// as a gather rounds them), the master (stage 3 only), and each step's verdict and scale.
struct rank_run {
  std::vector<double> weights, master;
  std::vector<bool> skipped;
  std::vector<double> scales;
  int skipped_changed = 0;  // skipped steps after which the parameters, the state or steps() had changed
  std::size_t updates = 0;  // the trainer's steps() at the end
  std::vector<double> scales_seen;  // what the model was told by set_loss_scale, step by step
};

// `p` ranks train `steps` steps from `first_step` (loading `load` first if given, saving to
// `save` after); `overflow(k, r)` puts an inf into rank r's gradient at step k.
struct run_spec {
  int p = 3, steps = 12, first_step = 0;
  std::function<bool(int step, int rank)> overflow;  // an inf (or -inf) in rank r's gradient at step k
  std::string load, save;
};

// Runs `spec`'s steps of `tr` on this rank's batches (loading and saving where `spec` says),
// recording into `mine` each step's verdict and scale, whether a skipped step changed anything
// (`parameters()`: the weights now; the updater's state; `steps()`) and the updates at the end.
template <class Trainer, class Parameters>
void record_steps(Trainer& tr, const run_spec& spec, rank_run& mine, Parameters&& parameters) {
  using master = std::remove_cvref_t<decltype(*tr.updater().state().begin())>;
  if (!spec.load.empty()) tr.load(spec.load);
  for (int k = spec.first_step; k < spec.first_step + spec.steps; ++k) {
    const std::size_t begin = (static_cast<std::size_t>(k) * batch) % 400;
    const std::vector<double> before = parameters();
    const std::vector<master> state(tr.updater().state().begin(), tr.updater().state().end());
    const std::size_t updates = tr.steps();
    const auto res = tr.step({begin, begin + batch});
    mine.skipped.push_back(res.skipped);
    mine.scales.push_back(res.loss_scale);
    const bool same_state = std::equal(state.begin(), state.end(), tr.updater().state().begin());
    if (res.skipped && (parameters() != before || !same_state || tr.steps() != updates)) ++mine.skipped_changed;
  }
  mine.updates = tr.steps();
  if (!spec.save.empty()) tr.save(spec.save);
}

// Several buckets of 2-byte values (20 and 64 elements: 69 and 61 parameters), none a multiple
// of P = 3 long; `Options` is a sharded or allreduce trainer's.
template <class Options>
Options small_buckets16() {
  Options o;
  o.first_bucket_bytes = 2 * 20;
  o.bucket_bytes = 2 * 64;
  return o;
}

// Where rank r's injected overflow lands: rank 0's in the last tensor, ranks 1's and 2's in the
// first element with opposite signs, so that no one bucket, slice or rank sees them all, and
// the two at once make a NaN of the average (inf - inf), not an inf.
inline std::size_t overflow_at(int r) { return r == 0 ? 129 : 0; }
inline float overflow_value(int r) { return r % 2 ? -INFINITY : INFINITY; }

// Makes rank r's `model` (a mixed_linear_model) overflow where `spec` says, and record in `mine`
// each loss scale it is told.
template <class Model>
void inject_overflows(Model& model, const run_spec& spec, int r, rank_run& mine) {
  model.overflow = [&spec, r](std::size_t pass) {
    return spec.overflow && spec.overflow(spec.first_step + static_cast<int>(pass), r);
  };
  model.overflow_at = overflow_at(r);
  model.overflow_value = overflow_value(r);
  model.on_scale = [&mine](double s) { mine.scales_seen.push_back(s); };
}

// Every rank's weights are rank 0's, bit for bit, and within T's rounding of the simulation's master.
template <class T, class M>
void require_matches(const std::vector<rank_run>& got, const mixed_run<M>& want) {
  for (const rank_run& r : got) REQUIRE(r.weights == got[0].weights);
  REQUIRE(got[0].weights.size() == want.master.size());
  for (std::size_t j = 0; j < want.master.size(); ++j) {
    INFO("weight " << j);
    const double rounded = element_cast<double>(element_cast<T>(want.master[j]));
    REQUIRE(got[0].weights[j] == Approx(rounded).epsilon(spacing<T>()).margin(1e-6));
  }
  if (got[0].master.empty()) return;  // stages 1 and 2 and the allreduce trainer keep the master to themselves
  for (std::size_t j = 0; j < want.master.size(); ++j) {
    INFO("master " << j);
    REQUIRE(got[0].master[j] == Approx(static_cast<double>(want.master[j])).epsilon(2e-5).margin(1e-6));
  }
}

// The relative L2 distance of `got` from `want`.
inline double distance(const std::vector<double>& got, const std::vector<double>& want) {
  double d = 0, n = 0;
  for (std::size_t j = 0; j < want.size(); ++j) d += (got[j] - want[j]) * (got[j] - want[j]), n += want[j] * want[j];
  return std::sqrt(d / n);
}

// The loss-scaling scenarios every trainer is tested with: scale 1024, halved after an overflow,
// doubled after 3 good steps in a row.
inline loss_scaling small_scaling() { return {true, 1024.0, 2.0, 0.5, 3}; }

// Rank 0 alone overflows at step 2; ranks 1 and 2 at step 5, -inf and inf (a NaN average). With
// momentum, which moves by the gradient's size, a step left scaled would show. `train(spec)`
// runs 3 ranks under small_scaling(); every rank must skip exactly steps 2 and 5, use and tell
// its model the simulation's scales, change nothing on a skipped step, and match the simulation.
template <class Train>
void check_skips_exactly_the_overflows(Train&& train) {
  run_spec spec;
  spec.overflow = [](int k, int r) { return (k == 2 && r == 0) || (k == 5 && r > 0); };
  const auto got = train(spec);
  const auto want = mixed_training<float16>(3, 12, momentum<float>(1e-2), small_scaling(), spec.overflow);
  const std::vector<bool> expected{false, false, true, false, false, true, false, false, false, false, false, false};
  const std::vector<double> scales{1024, 1024, 1024, 512, 512, 512, 256, 256, 256, 512, 512, 512};
  REQUIRE(want.skipped == expected);
  REQUIRE(want.scales == scales);
  for (const rank_run& r : got) {
    CHECK(r.skipped == expected);
    CHECK(r.scales == scales);
    CHECK(r.skipped_changed == 0);
    CHECK(r.updates == 10);
    CHECK(r.scales_seen == scales);
  }
  require_matches<float16>(got, want);
}

// 10 steps straight, and 5, a save to `path`, a load and 5 more: every rank's weights and scales
// the same. Good steps 0 and 1, an overflow at 2 (scale 1024 -> 512), good 3 and 4: the save holds
// scale 512 and 2 good steps, neither the starting state, so both must come back.
template <class Train>
void check_resumes_bit_for_bit(const std::string& path, Train&& train) {
  run_spec whole;
  whole.steps = 10;
  whole.overflow = [](int k, int r) { return k == 2 && r == 0; };
  const auto straight = train(whole);
  REQUIRE(straight[0].scales == std::vector<double>{1024, 1024, 1024, 512, 512, 512, 1024, 1024, 1024, 2048});
  run_spec first = whole, second = whole;
  first.steps = 5;
  first.save = path;
  second.first_step = 5;
  second.steps = 5;
  second.load = path;
  train(first);
  const auto resumed = train(second);
  for (std::size_t r = 0; r < straight.size(); ++r) {
    CHECK(resumed[r].weights == straight[r].weights);
    CHECK(resumed[r].scales == std::vector<double>(straight[r].scales.begin() + 5, straight[r].scales.end()));
  }
}

}  // namespace dtrain::testing
