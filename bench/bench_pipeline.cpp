// The pipeline schedules' measured bubble and live activations against their closed forms, on
// artificially balanced stages: every stage sleeps a fixed time per micro-batch (forward f,
// backward 2f; a chunk of an interleaved rank 1/v of that), so the ranks need no CPU and p
// processes measure the schedule, not the machine's cores. Activations of --activation-kib
// move over the real transport between the stages.
//
//   dtrain-run -n 4 ./bench_pipeline --rounds 3 --json pipeline_p4.json
//
// Columns: schedule, p, v, m, the measured bubble (1 - forward/backward time over pipeline time,
// summed over every rank, the median of the rounds), the formula (p-1)/(v m+p-1), their ratio,
// the most micro-batches (chunks) live on any rank and what the schedule promises, the median
// step time. Rounds alternate the schedules' order.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "dtrain/collective/communicator.hpp"
#include "dtrain/pipeline/schedule.hpp"
#include "dtrain/pipeline/simulate.hpp"
#include "dtrain/pipeline/trainer.hpp"
#include "dtrain/transport/group.hpp"
#include "dtrain/transport/tcp.hpp"
#include "dtrain/updater/sgd.hpp"
#include "report.hpp"

namespace {

using group = dtrain::process_group<dtrain::tcp_transport>;

// Waits `d` precisely: sleeps most of it (so ranks need no CPU), spins the last 300 us (a sleep
// alone overshoots by tens of microseconds, unevenly across ranks, which unbalances the stages).
void take(std::chrono::microseconds d) {
  const auto end = std::chrono::steady_clock::now() + d;
  if (d > std::chrono::microseconds(300)) std::this_thread::sleep_until(end - std::chrono::microseconds(300));
  while (std::chrono::steady_clock::now() < end) {
  }
}

// One forward or backward as it ran: stage, micro-batch, forward?, start and end (ms on the
// machine's monotonic clock, the same for every process).
using timed_run = std::array<double, 5>;

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A stage with no parameters that takes a fixed time per micro-batch.
struct sleeping_stage {
  using value_type = float;
  std::chrono::microseconds forward_time, backward_time;
  std::size_t in, out;
  int stage = 0;
  std::vector<timed_run>* log = nullptr;  // where each run is recorded, if anywhere
  std::size_t tensor_count() const noexcept { return 0; }
  std::span<float> parameters(std::size_t) { return {}; }
  std::span<float> gradients(std::size_t) { return {}; }
  std::size_t input_size() const noexcept { return in; }
  std::size_t output_size() const noexcept { return out; }
  double forward(const dtrain::micro_batch& mb, std::span<const float>, std::span<float>) {
    const double start = now_ms();
    take(forward_time);
    if (log != nullptr) log->push_back({double(stage), double(mb.index), 1.0, start, now_ms()});
    return 0;
  }
  void backward(const dtrain::micro_batch& mb, std::span<const float>, std::span<float>) {
    const double start = now_ms();
    take(backward_time);
    if (log != nullptr) log->push_back({double(stage), double(mb.index), 0.0, start, now_ms()});
  }
  void discard(const dtrain::micro_batch&) {}
};

struct point {
  std::string schedule;
  int v = 1, m = 1;
  std::vector<double> bubbles, step_seconds;
  int peak_live = 0, promised = 0;
};

// One-way time of an activation between rank 0 and rank 1 (half a ping-pong's round trip).
double one_way_seconds(group& world, std::size_t floats) {
  if (world.size() < 2 || world.rank() > 1) return 0;
  std::vector<float> buf(floats);
  const int peer = 1 - world.rank();
  const auto until = dtrain::deadline::after(std::chrono::seconds(60));
  constexpr int trips = 200;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < trips; ++i) {
    const auto bytes = std::as_writable_bytes(std::span(buf));
    if (world.rank() == 0) {
      world.isend(peer, 77, dtrain::signature{}, std::as_bytes(std::span(buf))).wait(until);
      world.irecv(peer, 77, bytes).wait(until);
    } else {
      world.irecv(peer, 77, bytes).wait(until);
      world.isend(peer, 77, dtrain::signature{}, std::as_bytes(std::span(buf))).wait(until);
    }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / trips / 2;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

template <class Schedule>
std::vector<sleeping_stage> stages_of(const group& world, const Schedule& schedule, double forward_us,
                                      std::size_t activation, std::vector<timed_run>* log = nullptr) {
  const int p = world.size(), r = world.rank(), v = schedule.chunks();
  std::vector<sleeping_stage> chunks;
  for (int c = 0; c < v; ++c) {
    const int s = c * p + r;
    const auto f = std::chrono::microseconds(static_cast<long>(forward_us / v));
    chunks.push_back({f, 2 * f, s == 0 ? 0 : activation, s == p * v - 1 ? 0 : activation, s, log});
  }
  return chunks;
}

// One step of `schedule` with m micro-batches, every forward and backward timed; rank 0 appends
// them to `json` as {"schedule", "p", "v", "m", "runs": [[rank, stage, mb, forward, start, end]]}.
template <class Schedule>
void record_timeline(group& world, dtrain::communicator<group>& sums, const Schedule& schedule, int m,
                     double forward_us, std::size_t activation, std::string& json) {
  std::vector<timed_run> log;
  dtrain::pipeline::trainer_options o;
  o.micro_batches = m;
  dtrain::pipeline::trainer<group, Schedule, dtrain::sgd<float>, sleeping_stage> t(
      world, stages_of(world, schedule, forward_us, activation, &log), dtrain::sgd<float>(), schedule, o);
  t.step();  // warm-up
  sums.barrier();
  log.clear();
  t.step();
  std::vector<double> mine;
  for (const timed_run& run : log) mine.insert(mine.end(), run.begin(), run.end());
  std::vector<double> all(mine.size() * static_cast<std::size_t>(world.size()));  // every rank runs as many
  sums.gather(std::span<const double>(mine), std::span(all), 0);
  if (world.rank() != 0) return;
  json += fmt::format("{}  {{\"schedule\": \"{}\", \"p\": {}, \"v\": {}, \"m\": {}, \"runs\": [",
                      json.size() > 2 ? ",\n" : "", Schedule::name, world.size(), schedule.chunks(), m);
  const std::size_t per_rank = mine.size() / 5;
  for (std::size_t i = 0; i < all.size() / 5; ++i) {
    const double* r = &all[i * 5];
    json +=
        fmt::format("{}[{}, {}, {}, {}, {:.3f}, {:.3f}]", i ? ", " : "", i / per_rank, r[0], r[1], r[2], r[3], r[4]);
  }
  json += "]}";
}

template <class Schedule>
void measure(group& world, dtrain::communicator<group>& sums, const Schedule& schedule,
             point& pt, int steps, double forward_us, std::size_t activation) {
  std::vector<sleeping_stage> chunks = stages_of(world, schedule, forward_us, activation);
  dtrain::pipeline::trainer_options o;
  o.micro_batches = pt.m;
  dtrain::pipeline::trainer<group, Schedule, dtrain::sgd<float>, sleeping_stage> t(world, std::move(chunks),
                                                                                   dtrain::sgd<float>(), schedule, o);
  t.step();  // warm-up: connections, buffers
  std::vector<double> totals{0, 0, 0};  // compute, pipeline time, wall
  int peak = 0;
  for (int i = 0; i < steps; ++i) {
    const auto rep = t.step().report;
    totals[0] += rep.compute_seconds;
    totals[1] += rep.wall_seconds - rep.update_seconds;
    totals[2] += rep.wall_seconds;
    peak = std::max(peak, rep.peak_live);
  }
  sums.allreduce(std::span(totals), dtrain::reduce_op::sum);
  std::vector<int> peaks{peak};
  sums.allreduce(std::span(peaks), dtrain::reduce_op::max);
  pt.bubbles.push_back(1.0 - totals[0] / totals[1]);
  pt.step_seconds.push_back(totals[2] / world.size() / steps);
  pt.peak_live = peaks[0];
}

// The bubble `pipeline/simulate.hpp` predicts for the point, with each message taking `latency`.
double simulated_bubble(const point& pt, int p, double forward, double latency) {
  namespace pl = dtrain::pipeline;
  const pl::step_costs costs{forward / pt.v, 2 * forward / pt.v, latency};
  if (pt.schedule == "gpipe") return pl::simulate(pl::gpipe{}, p, pt.m, costs).bubble();
  if (pt.schedule == "interleaved_one_f_one_b")
    return pl::simulate(pl::interleaved_one_f_one_b{pt.v}, p, pt.m, costs).bubble();
  if (pt.schedule == "pipedream") return pl::simulate(pl::pipedream{}, p, pt.m, costs).bubble();
  return pl::simulate(pl::one_f_one_b{}, p, pt.m, costs).bubble();
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 3, steps = 5;
  double forward_us = 20000;
  std::size_t activation_kib = 16;
  std::vector<int> micro_batches{1, 2, 4, 8, 16, 32};
  std::string json, timeline;
  CLI::App app{
      "Pipeline schedules' bubble and live activations on balanced sleeping stages (launch with dtrain-run -n p)"};
  app.add_option("--rounds", rounds, "rounds, alternating the schedules' order")->capture_default_str();
  app.add_option("--steps", steps, "steps per point and round")->capture_default_str();
  app.add_option("--forward-us", forward_us, "a stage's forward per micro-batch (backward: twice)")
      ->capture_default_str();
  app.add_option("--activation-kib", activation_kib, "activation size between stages")->capture_default_str();
  app.add_option("--micro-batches", micro_batches, "m values")->delimiter(',')->capture_default_str();
  app.add_option("--json", json, "write the table as JSON (rank 0)");
  app.add_option("--timeline", timeline, "instead: time every forward and backward of one step of each schedule at the "
                                         "first --micro-batches value, as JSON (bench/plot_pipeline.py draws it)");
  CLI11_PARSE(app, argc, argv);
  try {
    group world(dtrain::tcp_transport::from_environment());
    dtrain::communicator<group> sums(world);
    const int p = world.size();
    std::vector<point> points;
    for (int m : micro_batches) {
      for (const char* s : {"gpipe", "one_f_one_b", "interleaved_one_f_one_b", "pipedream"}) {
        point pt;
        pt.schedule = s;
        pt.v = pt.schedule == "interleaved_one_f_one_b" ? 2 : 1;
        pt.m = m;
        pt.promised = pt.schedule == "gpipe" ? m
                      : pt.v == 1            ? std::min(p, m)
                                  : std::min(dtrain::pipeline::interleaved_one_f_one_b{2}.warmups(p, m)[0] + 1, 2 * m);
        points.push_back(pt);
      }
    }
    const std::size_t activation = activation_kib * 1024 / sizeof(float);
    if (!timeline.empty()) {
      namespace pl = dtrain::pipeline;
      std::string out = "[\n";
      const int m = micro_batches.front();
      record_timeline(world, sums, pl::gpipe{}, m, forward_us, activation, out);
      record_timeline(world, sums, pl::one_f_one_b{}, m, forward_us, activation, out);
      record_timeline(world, sums, pl::interleaved_one_f_one_b{2}, m, forward_us, activation, out);
      record_timeline(world, sums, pl::pipedream{}, m, forward_us, activation, out);
      if (world.rank() == 0) dtrain::bench::write_file(timeline, out + "\n]\n");
      return 0;
    }
    const double latency = one_way_seconds(world, activation);
    for (int round = 0; round < rounds; ++round) {
      std::vector<std::size_t> order(points.size());
      for (std::size_t i = 0; i < order.size(); ++i) order[i] = round % 2 == 0 ? i : order.size() - 1 - i;
      for (std::size_t i : order) {
        point& pt = points[i];
        namespace pl = dtrain::pipeline;
        if (pt.schedule == "gpipe") measure(world, sums, pl::gpipe{}, pt, steps, forward_us, activation);
        if (pt.schedule == "one_f_one_b") measure(world, sums, pl::one_f_one_b{}, pt, steps, forward_us, activation);
        if (pt.schedule == "interleaved_one_f_one_b")
          measure(world, sums, pl::interleaved_one_f_one_b{2}, pt, steps, forward_us, activation);
        if (pt.schedule == "pipedream") measure(world, sums, pl::pipedream{}, pt, steps, forward_us, activation);
      }
    }
    if (world.rank() == 0) {
      fmt::print(
          "# bench_pipeline: p {}, forward {} us and backward {} us per stage and micro-batch, activations {} KiB "
          "({:.1f} us one way), {} rounds of {} steps\n",
          p, forward_us, 2 * forward_us, activation_kib, latency * 1e6, rounds, steps);
      fmt::print("# bubble: measured; formula: (p-1)/(v m+p-1); ratio: bubble/formula; model: the schedule simulated "
                 "with that message time\n");
      fmt::print("# {:>24} {:>3} {:>2} {:>4} {:>9} {:>9} {:>6} {:>9} {:>5} {:>8} {:>9}\n", "schedule", "p", "v", "m",
                 "bubble", "formula", "ratio", "model", "peak", "promised", "step_ms");
      std::string out = "[\n";
      for (std::size_t i = 0; i < points.size(); ++i) {
        const point& pt = points[i];
        const double measured = median(pt.bubbles), formula = dtrain::pipeline::bubble_fraction(p, pt.m, pt.v);
        const double ratio = formula > 0 ? measured / formula : 0;
        const double model = simulated_bubble(pt, p, forward_us * 1e-6, latency);
        fmt::print("  {:>24} {:>3} {:>2} {:>4} {:>9.4f} {:>9.4f} {:>6.3f} {:>9.4f} {:>5} {:>8} {:>9.2f}\n", pt.schedule,
                   p, pt.v, pt.m, measured, formula, ratio, model, pt.peak_live, pt.promised,
                   median(pt.step_seconds) * 1e3);
        out += fmt::format(
            "  {{\"schedule\": \"{}\", \"p\": {}, \"v\": {}, \"m\": {}, \"bubble\": {:.5f}, \"formula\": {:.5f}, "
            "\"model\": {:.5f}, \"peak_live\": {}, \"promised_peak\": {}, \"step_ms\": {:.3f}}}{}\n",
            pt.schedule, p, pt.v, pt.m, measured, formula, model, pt.peak_live, pt.promised,
            median(pt.step_seconds) * 1e3, i + 1 < points.size() ? "," : "");
      }
      dtrain::bench::write_file(json, out + "]\n");
    }
    return 0;
  } catch (const dtrain::error& e) {
    std::fprintf(stderr, "bench_pipeline: %s\n", e.what());
    return 1;
  }
}
