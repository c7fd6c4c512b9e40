// Bounded delay against its definition: tasks with random durations started through a
// task_window, in simulated time. Every task starts only after each task more than tau older
// finished, and no later than that (the window waits for nothing else). And the difference
// from SSP: bounded delay bounds a worker's own tasks in flight and never couples workers; SSP
// bounds the clock gap between workers and lets a lone worker's tasks pile up.

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "../catch.hpp"
#include "dtrain/concepts/consistency.hpp"
#include "dtrain/consistency/bounded_delay.hpp"
#include "dtrain/consistency/policies.hpp"

using namespace dtrain;

static_assert(consistency<bounded_delay<0>> && consistency<bounded_delay<3>>);

namespace {

// One worker's tasks in simulated time: task t computes for compute[t], then runs (its
// communication) for duration[t]. `finish` on a handle moves the worker's clock to that task's end.
struct timeline {
  std::vector<double> start, end;
};

timeline run_window(std::int64_t tau, const std::vector<double>& compute, const std::vector<double>& duration) {
  timeline tl;
  double now = 0;
  auto finish = [&](std::int64_t& t) { now = std::max(now, tl.end[static_cast<std::size_t>(t)]); };
  task_window<std::int64_t, decltype(finish)> window(tau, finish);
  for (std::int64_t t = 0; t < static_cast<std::int64_t>(compute.size()); ++t) {
    now += compute[static_cast<std::size_t>(t)];
    window.admit(t);
    REQUIRE(window.in_flight() <= static_cast<std::size_t>(tau));  // room for this one: tau + 1 at most
    tl.start.push_back(now);
    tl.end.push_back(now + duration[static_cast<std::size_t>(t)]);
    window.started(t, t);
  }
  window.drain();
  return tl;
}

}  // namespace

TEST_CASE("bounded delay: each task starts once every task more than tau older finished, not later", "[consistency]") {
  std::mt19937 gen(11);
  std::exponential_distribution<double> compute_time(1.0), comm_time(0.3);  // communication ~3x compute
  for (std::int64_t tau : {0, 1, 2, 5, 40}) {
    for (int trial = 0; trial < 20; ++trial) {
      const std::size_t n = 200;
      std::vector<double> compute(n), duration(n);
      for (auto& c : compute) c = compute_time(gen);
      for (auto& d : duration) d = comm_time(gen);
      const timeline tl = run_window(tau, compute, duration);
      // The definition: task t starts after every task t' < t - tau has finished.
      for (std::size_t t = 0; t < n; ++t) {
        for (std::size_t u = 0; u + static_cast<std::size_t>(tau) < t; ++u) REQUIRE(tl.end[u] <= tl.start[t]);
      }
      // Independently: the earliest start the definition allows, by the recurrence
      // start[t] = max(start[t-1] + compute[t], latest end of the tasks before t - tau).
      double ready = 0, latest_required_end = 0;
      for (std::size_t t = 0; t < n; ++t) {
        ready += compute[t];
        if (t >= static_cast<std::size_t>(tau) + 1)
          latest_required_end = std::max(latest_required_end, tl.end[t - static_cast<std::size_t>(tau) - 1]);
        ready = std::max(ready, latest_required_end);
        REQUIRE(tl.start[t] == ready);
      }
    }
  }
}

TEST_CASE("bounded delay 0 is sequential, and a larger tau overlaps communication", "[consistency]") {
  const std::vector<double> compute(50, 1.0), duration(50, 3.0);
  const timeline seq = run_window(0, compute, duration);
  for (std::size_t t = 1; t < 50; ++t) CHECK(seq.start[t] >= seq.end[t - 1]);  // one at a time
  CHECK(seq.end.back() == Approx(1.0 + 50 * 3.0));  // each compute overlaps the previous transfer only
  const timeline overlapped = run_window(3, compute, duration);  // 3 in flight hide a 3x transfer
  CHECK(overlapped.end.back() == Approx(50 * 1.0 + 3.0));
}

TEST_CASE("bounded delay and SSP bound different things", "[consistency]") {
  // Two workers, one three times as fast. Clock = tasks started; a task's communication takes 5.
  auto simulate = [](auto policy, std::int64_t tau, int workers) {
    struct result {
      std::int64_t max_gap = 0;
      std::size_t max_in_flight = 0;
    } out;
    const double speed[] = {1.0, 3.0};
    std::vector<double> now(static_cast<std::size_t>(workers), 0.0);
    std::vector<std::int64_t> clock(static_cast<std::size_t>(workers), 0);
    std::vector<std::vector<double>> ends(static_cast<std::size_t>(workers));
    for (int round = 0; round < 300; ++round) {
      // The worker with the earliest time acts next (a discrete-event step).
      const auto w = static_cast<std::size_t>(std::min_element(now.begin(), now.end()) - now.begin());
      const std::int64_t slowest = *std::min_element(clock.begin(), clock.end());
      if (!policy.may_advance(clock[w], slowest)) {  // SSP: wait for the slowest to move
        now[w] = *std::min_element(now.begin(), now.end()) + 0.5;
        if (workers > 1) now[w] = std::max(now[w], now[1 - w] + 0.01);
        continue;
      }
      if (tau >= 0 && clock[w] > tau) now[w] = std::max(now[w], ends[w][static_cast<std::size_t>(clock[w] - tau - 1)]);
      now[w] += speed[w];
      ends[w].push_back(now[w] + 5.0);
      ++clock[w];
      std::size_t in_flight = 0;
      for (double e : ends[w]) in_flight += e > now[w] ? 1 : 0;
      out.max_in_flight = std::max(out.max_in_flight, in_flight);
      out.max_gap = std::max(
          out.max_gap, *std::max_element(clock.begin(), clock.end()) - *std::min_element(clock.begin(), clock.end()));
    }
    return out;
  };
  const auto bd = simulate(bounded_delay<1>{}, 1, 2);
  const auto ss = simulate(ssp<1>{}, -1, 2);
  CHECK(bd.max_in_flight <= 2);   // tau + 1 of a worker's own tasks at most
  CHECK(bd.max_gap > 20);         // but the fast worker runs away from the slow one
  CHECK(ss.max_gap <= 2);         // SSP keeps them within s + 1 clocks
  const auto alone = simulate(ssp<1>{}, -1, 1);
  CHECK(alone.max_in_flight > 2); // and never holds a lone worker back from its own transfers
}
