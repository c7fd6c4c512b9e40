// The allreduce trainer against a serial simulation of the same equations: synchronous
// data-parallel momentum SGD, local SGD with periodic averaging, compression; plus start-up
// checks (broadcast, plan mismatch), model misuse, and the schedule and sync batch norm helpers.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <mutex>
#include <random>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "../catch.hpp"
#include "dtrain/updater/lr_schedule.hpp"
#include "dtrain/allreduce/sync_batch_norm.hpp"
#include "dtrain/allreduce/trainer.hpp"
#include "dtrain/collective/communicator.hpp"
#include "dtrain/core/trace.hpp"
#include "dtrain/transport/inproc.hpp"
#include "dtrain/updater/momentum.hpp"
#include "linear_model.hpp"
#include "checks.hpp"
#include "simulation.hpp"
#include "../support/thread_checks.hpp"

using namespace dtrain;
using dtrain::testing::linear_model;
using dtrain::testing::regression_data;
using comm_t = ring<inproc_transport>;

namespace {

using namespace dtrain::testing;

// Runs the trainer on p in-process ranks; returns each rank's final weights.
std::vector<std::vector<double>> train(int p, int steps, allreduce::trainer_options options,
                                       bool shuffled_ready_order = false, bool gaps = false) {
  std::vector<std::vector<double>> out(static_cast<std::size_t>(p));
  run_inproc(p, [&](int r, inproc_transport t) {
    auto data = data_of(r);
    // Rank-specific start: the broadcast must replace it with rank 0's.
    linear_model m(tensor_sizes, data, r == 0 ? 0.25 : 1.0 + r, gaps);
    if (shuffled_ready_order) {  // each rank reports its gradients in its own order
      std::mt19937 gen(static_cast<unsigned>(r));
      std::shuffle(m.ready_order().begin(), m.ready_order().end(), gen);
    }
    allreduce::trainer tr(comm_t(std::move(t)), momentum<double>(lr, mu), m, options);
    for (int k = 0; k < steps; ++k) {
      const std::size_t begin = (static_cast<std::size_t>(k) * batch) % 400;
      tr.step({begin, begin + batch});
    }
    out[static_cast<std::size_t>(r)] = m.weights();
  });
  return out;
}

}  // namespace

TEST_CASE("bucket plan: reverse order, small first bucket, every tensor once", "[allreduce]") {
  const std::vector<std::size_t> sizes{100, 5, 300, 2, 2, 50};
  allreduce::bucket_plan plan(sizes, 4, 16, 1000);
  // Reverse order: 50 (200 B >= 16: closes the first bucket), then 2, 2, 300 (1216 B), then 5, 100.
  REQUIRE(plan.buckets().size() == 3);
  CHECK(plan.buckets()[0].tensors == std::vector<std::size_t>{5});
  CHECK(plan.buckets()[1].tensors == std::vector<std::size_t>{4, 3, 2});
  CHECK(plan.buckets()[1].offsets == std::vector<std::size_t>{0, 2, 4});
  CHECK(plan.buckets()[2].tensors == std::vector<std::size_t>{1, 0});
  CHECK(plan.elements() == 459);
  CHECK(plan.parameter_offset(2) == 105);
  CHECK(plan.bucket_of(0) == 2);
  CHECK(allreduce::bucket_plan(sizes, 4, 16, 1000).fingerprint() == plan.fingerprint());
  CHECK(allreduce::bucket_plan(sizes, 4, 16, 100000).fingerprint() != plan.fingerprint());
  const std::vector<std::size_t> other{100, 5, 300, 2, 3, 50};
  CHECK(allreduce::bucket_plan(other, 4, 16, 1000).fingerprint() != plan.fingerprint());
}

TEST_CASE("synchronous trainer equals the serial simulation, replicas bit-identical", "[allreduce]") {
  for (int p : {1, 2, 3, 4}) {
    for (int variant = 0; variant < 3; ++variant) {
      const bool shuffled = variant == 1, gaps = variant == 2;
      INFO("ranks " << p << (shuffled ? ", per-rank ready order" : "") << (gaps ? ", tensors apart" : ""));
      const auto got = train(p, 30, small_buckets(), shuffled, gaps);
      const auto want = simulate(p, 30, 1, 0);
      require_close(got[0], want[0], 1e-12);
      for (const auto& w : got) REQUIRE(w == got[0]);
    }
  }
}

TEST_CASE("the learning-rate hook sets each step's rate, and the update uses it", "[allreduce]") {
  // A rate that changes every step (decay with a bump at step 7): the reported rate and the
  // weights must follow it step by step, as the serial simulation with the same rates does.
  const auto rate = [](std::size_t step) {
    return 0.05 / (1.0 + 0.1 * static_cast<double>(step)) + (step == 7 ? 0.02 : 0.0);
  };
  allreduce::trainer_options o = small_buckets();
  o.learning_rate = rate;
  std::vector<double> reported;
  std::vector<std::vector<double>> got(3);
  run_inproc(3, [&](int r, inproc_transport t) {
    auto data = data_of(r);
    linear_model m(tensor_sizes, data, 0.25);
    allreduce::trainer tr(comm_t(std::move(t)), momentum<double>(lr, mu), m, o);
    for (int k = 0; k < 15; ++k) {
      const std::size_t begin = (static_cast<std::size_t>(k) * batch) % 400;
      const auto result = tr.step({begin, begin + batch});
      if (r == 0) reported.push_back(result.learning_rate);
    }
    got[static_cast<std::size_t>(r)] = m.weights();
  });
  REQUIRE(reported.size() == 15);
  for (std::size_t k = 0; k < reported.size(); ++k) CHECK(reported[k] == rate(k));
  require_close(got[1], simulate(3, 15, 1, 0, rate)[0], 1e-12);
}

TEST_CASE("one bucket and no overlap give the same result", "[allreduce]") {
  allreduce::trainer_options o;
  o.overlap = false;
  const auto got = train(3, 20, o);
  require_close(got[2], simulate(3, 20, 1, 0)[0], 1e-12);
}

TEST_CASE("local SGD averages parameters every tau steps after the synchronous warm-up", "[allreduce]") {
  for (std::size_t tau : {2, 5}) {
    INFO("tau " << tau);
    auto o = small_buckets();
    o.average_every = tau;
    o.local_sgd_after = 3;
    const int steps = 3 + 4 * static_cast<int>(tau) + 1;  // ends one step after an averaging
    const auto got = train(3, steps, o, false, tau == 5);
    const auto want = simulate(3, steps, tau, 3);
    for (std::size_t r = 0; r < 3; ++r) require_close(got[r], want[r], 1e-12);
    CHECK(got[0] != got[1]);  // the last step was local
  }
}

TEST_CASE("fp16 and bf16 compression stay within half precision of the exact gradient", "[allreduce]") {
  // One step from the common start: the update is -lr * (averaged gradient), so its error is the
  // compression's error. 16-bit rounding of g/P, then of each partial sum on the way.
  const auto exact = simulate(4, 1, 1, 0)[0];
  for (auto c : {allreduce::compression::fp16, allreduce::compression::bf16}) {
    auto o = small_buckets();
    o.compress = c;
    const auto got = train(4, 1, o, false, true);
    double worst = 0, largest = 0;
    for (std::size_t j = 0; j < exact.size(); ++j) {
      worst = std::max(worst, std::fabs(got[0][j] - exact[j]));
      largest = std::max(largest, std::fabs(exact[j] - 0.25));
    }
    const double unit = c == allreduce::compression::fp16 ? 0x1p-11 : 0x1p-8;  // half an ulp, relative
    INFO("compression " << static_cast<int>(c) << " worst error " << worst << " of steps up to " << largest);
    CHECK(worst <= 4 * unit * largest);  // g/P rounded, then up to 3 rounded partial sums
    CHECK(worst > 0);                    // it really went through 16 bits
    for (const auto& w : got) CHECK(w == got[0]);
  }
}

TEST_CASE("the trainer counts bytes and time", "[allreduce]") {
  for (auto c : {allreduce::compression::none, allreduce::compression::fp16}) {
    run_inproc(2, [&](int r, inproc_transport t) {
      auto data = data_of(r);
      linear_model m(tensor_sizes, data, 0.25);
      auto o = small_buckets();
      o.compress = c;
      allreduce::trainer tr(comm_t(std::move(t)), momentum<double>(lr, mu), m, o);
      const auto before = tr.stats().bytes_reduced;
      tr.step({0, batch});
      tr.step({batch, 2 * batch});
      const std::uint64_t per_step = dim() * (c == allreduce::compression::none ? 8 : 2);
      TCHECK(tr.stats().steps == 2);  // on every rank
      TCHECK(tr.stats().bytes_reduced - before == 2 * per_step);
      TCHECK(tr.stats().step_seconds >= tr.stats().compute_seconds + tr.stats().wait_seconds);
    });
  }
}

TEST_CASE("every rank starts from the root's parameters", "[allreduce]") {
  run_inproc(3, [&](int r, inproc_transport t) {
    auto data = data_of(r);
    linear_model m(tensor_sizes, data, 10.0 + r);
    allreduce::trainer_options o = small_buckets();
    o.root = 2;
    allreduce::trainer tr(comm_t(std::move(t)), momentum<double>(lr, mu), m, o);
    const auto w = m.weights();
    if (std::any_of(w.begin(), w.end(), [](double v) { return v != 12.0; })) {
      throw std::runtime_error("rank " + std::to_string(r) + " did not receive the root's parameters");
    }
  });
}

TEST_CASE("ranks with different models or options fail at start-up, all of them, naming the rank",
          "[allreduce]") {
  for (int variant = 0; variant < 3; ++variant) {
    std::mutex mu_;
    std::vector<std::string> errors;
    run_inproc(3, [&](int r, inproc_transport t) {
      auto data = data_of(r);
      auto sizes = tensor_sizes;
      auto o = small_buckets();
      if (r == 1 && variant == 0) sizes = {3, 40, 1, 17, 61, 8};  // same total, other split
      if (r == 1 && variant == 1) o.compress = allreduce::compression::bf16;
      // Same sizes, but tensors stored apart: its buckets would be laid out differently.
      linear_model m(sizes, data, 0.25, r == 1 && variant == 2);
      try {
        allreduce::trainer tr(comm_t(std::move(t)), momentum<double>(lr, mu), m, o);
      } catch (const dtrain::error& e) {
        std::lock_guard lock(mu_);
        errors.push_back(std::to_string(static_cast<int>(e.code().value())) + " " + e.what());
      }
    });
    REQUIRE(errors.size() == 3);
    for (const auto& e : errors) {
      INFO(e);
      CHECK(e.rfind(std::to_string(static_cast<int>(errc::invalid_argument)) + " ", 0) == 0);
      CHECK(e.find("rank 1 has") != std::string::npos);
    }
  }
}

TEST_CASE("a model that skips or repeats a gradient report gets a clear error", "[allreduce]") {
  for (int variant = 0; variant < 2; ++variant) {
    std::mutex mu_;
    std::vector<std::string> errors;
    run_inproc(2, [&](int r, inproc_transport t) {
      auto data = data_of(r);
      linear_model m(tensor_sizes, data, 0.25);
      allreduce::trainer tr(comm_t(std::move(t)), momentum<double>(lr, mu), m, small_buckets());
      tr.step({0, batch});
      if (variant == 0) m.ready_order().pop_back();                           // tensor 0 never reported
      if (variant == 1) m.ready_order().back() = m.ready_order().front();     // tensor 5 twice, 0 never
      try {
        tr.step({batch, 2 * batch});
      } catch (const dtrain::error& e) {
        std::lock_guard lock(mu_);
        errors.push_back(e.what());
      }
      try {
        tr.step({0, batch});
      } catch (const dtrain::error& e) {
        std::lock_guard lock(mu_);
        if (e.code() == errc::broken) errors.push_back("broken");
      }
    });
    REQUIRE(errors.size() == 4);
    std::sort(errors.begin(), errors.end());  // "allreduce::trainer: ..." sorts before "broken"
    for (int k = 0; k < 2; ++k) {
      INFO(errors[static_cast<std::size_t>(k)]);
      CHECK(errors[static_cast<std::size_t>(k)].find(variant == 0 ? "never reported tensor 0"
                                                                  : "reported tensor 5 twice") != std::string::npos);
    }
    CHECK(errors[2] == "broken");
    CHECK(errors[3] == "broken");
  }
}

TEST_CASE("with_collective runs in order with the buckets, also from inside backward", "[allreduce]") {
  std::vector<double> sums(3), trained_once;
  run_inproc(3, [&](int r, inproc_transport t) {
    auto data = data_of(r);
    linear_model m(tensor_sizes, data, 0.25);
    allreduce::trainer tr(comm_t(std::move(t)), momentum<double>(lr, mu), m, small_buckets());
    std::vector<double> value{1.0 + r};
    // Runs after half the gradients are reported, so some buckets are queued before it.
    m.midway = [&] { tr.sum_across_ranks(std::span(value)); };
    tr.step({0, batch});
    sums[static_cast<std::size_t>(r)] = value[0];
    if (r == 0) trained_once = m.weights();
  });
  CHECK(sums == std::vector<double>{6.0, 6.0, 6.0});
  require_close(trained_once, simulate(3, 1, 1, 0)[0], 1e-12);
}

TEST_CASE("lr_schedule: linear scaling, warm-up, cosine decay", "[allreduce]") {
  auto s = lr_schedule::linear_scaling(0.1, 1024, 256, 100);
  CHECK(s(0) == Approx(0.1));
  CHECK(s(50) == Approx(0.1 + 0.5 * 0.3));
  CHECK(s(100) == Approx(0.4));
  CHECK(s(100000) == Approx(0.4));
  lr_schedule c{0.1, 2.0, 10, 110, 0.1};
  CHECK(c(10) == Approx(0.2));
  CHECK(c(60) == Approx(0.02 + 0.18 * 0.5));
  CHECK(c(110) == Approx(0.02));
  CHECK(c(500) == Approx(0.02));
}

TEST_CASE("sync batch moments equal the moments of the concatenated batch", "[allreduce]") {
  constexpr std::size_t channels = 4;
  const std::size_t rows[3] = {5, 0, 7};  // a rank with an empty batch contributes nothing
  std::vector<std::vector<float>> x(3);
  std::mt19937 gen(3);
  std::normal_distribution<float> n(2.0f, 3.0f);
  for (std::size_t r = 0; r < 3; ++r) {
    x[r].resize(rows[r] * channels);
    for (float& v : x[r]) v = n(gen);
  }
  std::vector<allreduce::batch_moments> got(3);
  std::vector<std::vector<double>> dsum(3);
  run_inproc(3, [&](int r, inproc_transport t) {
    comm_t comm(std::move(t));
    auto sum = [&](std::span<double> v) { comm.allreduce(v, reduce_op::sum); };
    const auto& mine = x[static_cast<std::size_t>(r)];
    got[static_cast<std::size_t>(r)] = allreduce::sync_batch_moments(std::span<const float>(mine), channels, sum);
    dsum[static_cast<std::size_t>(r)] = allreduce::sync_channel_sums(std::span<const float>(mine), channels, sum);
  });
  for (std::size_t c = 0; c < channels; ++c) {
    std::vector<double> all;
    for (std::size_t r = 0; r < 3; ++r)
      for (std::size_t i = 0; i < rows[r]; ++i) all.push_back(x[r][i * channels + c]);
    double mean = 0, var = 0;
    for (double v : all) mean += v / static_cast<double>(all.size());
    for (double v : all) var += (v - mean) * (v - mean) / static_cast<double>(all.size());
    for (std::size_t r = 0; r < 3; ++r) {
      CHECK(got[r].count == 12);
      CHECK(got[r].mean[c] == Approx(mean).epsilon(1e-12));
      CHECK(got[r].variance[c] == Approx(var).epsilon(1e-10));
      CHECK(dsum[r][c] == Approx(mean * 12).epsilon(1e-12));
    }
  }
  std::vector<float> ragged(7);
  CHECK_THROWS_AS(allreduce::sync_batch_moments(std::span<const float>(ragged), channels, [](std::span<double>) {}),
                  dtrain::error);
}

TEST_CASE("buckets are reduced while the backward pass is still running", "[allreduce]") {
  // The model pauses halfway through reporting; the buckets already complete must be reduced
  // during the pause, on the communication thread. Seen through each rank's own timeline.
  std::vector<std::vector<trace::recorder::event>> timelines(2);
  run_inproc(2, [&](int r, inproc_transport t) {
    auto data = data_of(r);
    linear_model m(tensor_sizes, data, 0.25);
    trace::recorder tracer(("/tmp/dtrain_overlap_test_" + std::to_string(r)).c_str());
    auto o = small_buckets();
    o.tracer = &tracer;
    allreduce::trainer tr(comm_t(std::move(t)), momentum<double>(lr, mu), m, o);
    TREQUIRE(tr.plan().buckets().size() >= 2);  // the first is complete at the pause
    m.midway = [] { std::this_thread::sleep_for(std::chrono::milliseconds(200)); };
    tr.step({0, batch});
    timelines[static_cast<std::size_t>(r)] = tracer.events();
  });
  for (int r = 0; r < 2; ++r) {  // written when each trainer and recorder went away
    std::remove(("/tmp/dtrain_overlap_test_" + std::to_string(r) + "." + std::to_string(r) + ".json").c_str());
  }
  for (const auto& events : timelines) {
    const auto fb =
        std::find_if(events.begin(), events.end(), [](const auto& e) { return e.name == "forward+backward"; });
    REQUIRE(fb != events.end());
    std::size_t during = 0, on_other_thread = 0;
    for (const auto& e : events) {
      if (e.name != "allreduce gradients") continue;
      if (e.ts + e.dur <= fb->ts + fb->dur - 100000) ++during;  // finished well before backward did
      if (e.tid != fb->tid) ++on_other_thread;
    }
    CHECK(during >= 1);
    CHECK(on_other_thread >= 1);
  }
}
