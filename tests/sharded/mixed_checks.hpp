// What the mixed-precision tests of every trainer record and check (tests/sharded/ and
// tests/allreduce/mixed_precision.cpp): each rank's run, and its weights against the serial
// mixed-precision simulation (mixed_models.hpp).
#pragma once

#include <cmath>
#include <concepts>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "../catch.hpp"
#include "dtrain/core/element.hpp"
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

// Where rank r's injected overflow lands: each rank its own tensor and sign, so that no one
// bucket, slice or rank sees them all, and two at once make a NaN of the average.
inline std::size_t overflow_at(int r) { return r == 0 ? 129 : r == 1 ? 0 : 64; }
inline float overflow_value(int r) { return r % 2 ? -INFINITY : INFINITY; }

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

}  // namespace dtrain::testing
