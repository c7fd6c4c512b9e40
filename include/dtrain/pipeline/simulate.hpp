#pragma once
/// @file
/// Runs every rank's action sequence of a pipeline schedule serially, in one thread, with
/// messages as queues: proves the schedule cannot deadlock (each receive finds its message,
/// in order), that each micro-batch runs forward before backward on every stage, once each, and
/// gives the schedule's timeline, bubble and peak live activations under given costs.
///
/// Receives block and sends do not, as in the executor (it waits on its sends only at the end of
/// the step, and the transport delivers a send once its receive is posted), so a schedule that
/// passes here cannot deadlock there.

#include <algorithm>
#include <cstddef>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/pipeline/action.hpp"

namespace dtrain::pipeline {

/// What a simulated step costs: forward and backward of one micro-batch on one stage (chunk),
/// and a message's latency.
struct step_costs {
  double forward = 1.0;
  double backward = 1.0;
  double message = 0.0;
};

/// One compute action on the simulated timeline.
struct timed_action {
  int rank = 0;
  action what{};
  double start = 0;
  double end = 0;
};

/// The outcome of simulating one step of a schedule.
struct simulation {
  /// Empty when the schedule is sound; else what went wrong, naming the rank and the action.
  std::string problem;
  /// Per rank, the most micro-batches (chunks) forwarded and not yet backwarded at once.
  std::vector<int> peak_live;
  /// Per rank, the time spent computing.
  std::vector<double> busy;
  /// When the last rank finished.
  double makespan = 0;
  /// Every forward and backward, by rank, in the order run.
  std::vector<timed_action> timeline;
  /// After a deadlock, each rank's action it waits at (its sequence's length if it finished).
  std::vector<std::size_t> stopped_at;

  bool ok() const noexcept { return problem.empty(); }
  /// The idle fraction of the step over all ranks: 1 - busy / (ranks * makespan).
  double bubble() const noexcept {
    double total = 0;
    for (double b : busy) total += b;
    return makespan > 0 ? 1.0 - total / (static_cast<double>(busy.size()) * makespan) : 0.0;
  }
};

namespace detail {

/// The state of one simulated step: each rank's position and clock, the message queues, and
/// what each (stage, micro-batch) has been through.
class step_simulator {
 public:
  step_simulator(std::vector<std::vector<action>> plan, const pipeline_shape& shape, const step_costs& costs)
      : plan_(std::move(plan)), shape_(shape), costs_(costs), pc_(plan_.size()), clock_(plan_.size()),
        live_(plan_.size()) {
    const auto cells = static_cast<std::size_t>(shape.stages()) * static_cast<std::size_t>(shape.micro_batches);
    received_activation_.assign(cells, false);
    received_gradient_.assign(cells, false);
    forwarded_.assign(cells, 0);
    backwarded_.assign(cells, 0);
    result_.peak_live.assign(plan_.size(), 0);
    result_.busy.assign(plan_.size(), 0.0);
  }

  simulation run() {
    if (static_cast<int>(plan_.size()) != shape_.ranks)
      return fail("the plan has " + std::to_string(plan_.size()) + " ranks, the shape " + std::to_string(shape_.ranks));
    for (bool progress = true; progress && result_.ok();) {
      progress = false;
      for (std::size_t r = 0; r < plan_.size() && result_.ok(); ++r) {
        while (pc_[r] < plan_[r].size() && result_.ok() && run_one(static_cast<int>(r))) {
          ++pc_[r];
          progress = true;
        }
      }
    }
    if (!result_.ok()) return std::move(result_);
    std::string blocked;
    for (std::size_t r = 0; r < plan_.size(); ++r) {
      if (pc_[r] < plan_[r].size()) blocked += " rank " + std::to_string(r) + " at " + describe(plan_[r][pc_[r]]) + ";";
    }
    if (!blocked.empty()) {
      result_.stopped_at = pc_;
      return fail("deadlock:" + blocked);
    }
    for (int s = 0; s < shape_.stages(); ++s) {
      for (int mb = 0; mb < shape_.micro_batches; ++mb) {
        if (forwarded_[cell(s, mb)] != 1 || backwarded_[cell(s, mb)] != 1) {
          return fail("stage " + std::to_string(s) + " ran micro-batch " + std::to_string(mb) + " forward " +
                      std::to_string(forwarded_[cell(s, mb)]) + " and backward " +
                      std::to_string(backwarded_[cell(s, mb)]) + " times, not once each");
        }
      }
    }
    for (const auto& [key, queue] : queues_) {
      if (!queue.empty()) return fail("a message to stage " + std::to_string(key.first) + " was never received");
    }
    for (std::size_t r = 0; r < plan_.size(); ++r) result_.makespan = std::max(result_.makespan, clock_[r]);
    return std::move(result_);
  }

 private:
  struct message {
    int mb;
    double arrival;
  };

  std::size_t cell(int s, int mb) const noexcept {
    return static_cast<std::size_t>(s) * static_cast<std::size_t>(shape_.micro_batches) + static_cast<std::size_t>(mb);
  }

  simulation fail(std::string what) {
    flag(std::move(what));
    return std::move(result_);
  }
  void flag(std::string what) { result_.problem = std::move(what); }

  // Runs rank r's next action; false when it must wait for a message (or failed).
  bool run_one(int r) {
    const action& a = plan_[r][pc_[r]];
    const auto at = [&] { return "rank " + std::to_string(r) + ", " + describe(a) + ": "; };
    if (a.mb < 0 || a.mb >= shape_.micro_batches || a.chunk < 0 || a.chunk >= shape_.chunks) {
      flag(at() + "no such micro-batch or chunk");
      return false;
    }
    const int s = shape_.stage_of(r, a.chunk);
    const std::size_t c = cell(s, a.mb);
    const bool forward_side = a.kind == action_kind::recv_activation || a.kind == action_kind::send_activation;
    switch (a.kind) {
      case action_kind::recv_activation:
      case action_kind::recv_gradient: {
        auto& queue = queues_[{s, forward_side}];
        if (queue.empty()) return false;
        const message m = queue.front();
        if (m.mb != a.mb) {
          flag(at() + "the next message on that link carries micro-batch " + std::to_string(m.mb));
          return false;
        }
        queue.pop_front();
        clock_[r] = std::max(clock_[r], m.arrival);
        (forward_side ? received_activation_ : received_gradient_)[c] = true;
        return true;
      }
      case action_kind::send_activation:
      case action_kind::send_gradient: {
        const bool done = forward_side ? forwarded_[c] > 0 : backwarded_[c] > 0;
        const int to = forward_side ? s + 1 : s - 1;
        if (!done || to < 0 || to >= shape_.stages()) {
          flag(at() + (done ? "there is no stage to send to" : "sends before computing what it sends"));
          return false;
        }
        queues_[{to, forward_side}].push_back({a.mb, clock_[r] + costs_.message});
        return true;
      }
      case action_kind::forward:
        if ((s > 0 && !received_activation_[c]) || forwarded_[c] > 0) {
          flag(at() + (forwarded_[c] > 0 ? "runs twice" : "runs before its input arrived"));
          return false;
        }
        ++forwarded_[c];
        result_.peak_live[r] = std::max(result_.peak_live[r], ++live_[r]);
        compute(r, a, costs_.forward);
        return true;
      case action_kind::backward:
        if (forwarded_[c] == 0 || backwarded_[c] > 0 || (s + 1 < shape_.stages() && !received_gradient_[c])) {
          flag(at() + (forwarded_[c] == 0   ? "runs before its forward"
                       : backwarded_[c] > 0 ? "runs twice"
                                            : "runs before its output's gradient arrived"));
          return false;
        }
        ++backwarded_[c];
        --live_[r];
        compute(r, a, costs_.backward);
        return true;
      case action_kind::optimizer_step:
        return true;
    }
    return true;
  }

  void compute(int r, const action& a, double cost) {
    result_.timeline.push_back({r, a, clock_[r], clock_[r] + cost});
    clock_[r] += cost;
    result_.busy[static_cast<std::size_t>(r)] += cost;
  }

  std::vector<std::vector<action>> plan_;
  pipeline_shape shape_;
  step_costs costs_;
  std::vector<std::size_t> pc_;
  std::vector<double> clock_;
  std::vector<int> live_;
  std::map<std::pair<int, bool>, std::deque<message>> queues_;  // (to stage, activation?) -> in flight
  std::vector<bool> received_activation_, received_gradient_;
  std::vector<int> forwarded_, backwarded_;
  simulation result_;
};

}  // namespace detail

/// Simulates one step of the per-rank action sequences `plan` (one per rank) on `shape`.
inline simulation simulate(std::vector<std::vector<action>> plan, const pipeline_shape& shape,
                           const step_costs& costs = {}) {
  return detail::step_simulator(std::move(plan), shape, costs).run();
}

/// Simulates one step of `schedule` (anything with `chunks()` and `actions(rank, shape)`) on
/// `ranks` ranks with `micro_batches` micro-batches.
template <class Schedule>
simulation simulate(const Schedule& schedule, int ranks, int micro_batches, const step_costs& costs = {}) {
  const pipeline_shape shape{ranks, schedule.chunks(), micro_batches};
  std::vector<std::vector<action>> plan;
  for (int r = 0; r < ranks; ++r) plan.push_back(schedule.actions(r, shape));
  return simulate(std::move(plan), shape, costs);
}

}  // namespace dtrain::pipeline
