#pragma once
// The jobs tests/ps/faults.cpp and membership.cpp start: ps_worker processes with a server or
// worker killed, leaving or joining, and the checks on what they logged (push logs, the
// survivors' statuses, the checkpoints they wrote).

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <tuple>
#include <string>
#include <utility>
#include <unistd.h>
#include <vector>

#include "../catch.hpp"
#include "../support/program_group.hpp"

namespace dtrain::fault_jobs {

using namespace dtrain::testing;

template <class Extra>
group_run run_ps(int n, const std::string& mode, Extra extra) {
  return run_program_group(DTRAIN_PS_WORKER, n, mode, extra, nothing_during, 90s);
}

// The checkpoint file of shard `s`'s `which` table ("sparse", "dense") at clock `c` under `prefix`.
inline std::string checkpoint_file(const std::string& prefix, int s, int c, const char* which) {
  return prefix + ".shard" + std::to_string(s) + ".c" + std::to_string(c) + "." + which;
}

// Removes every file named `prefix`.shard*, in its directory: the checkpoints, and the temporary
// file a server SIGKILLed mid-write leaves beside them.
inline void remove_checkpoints(const std::string& prefix) {
  const std::filesystem::path p(prefix);
  const std::string start = p.filename().string() + ".shard";
  std::error_code ec;
  for (const auto& f : std::filesystem::directory_iterator(p.parent_path(), ec)) {
    if (f.path().filename().string().starts_with(start)) std::filesystem::remove(f.path(), ec);
  }
}

// Where the exact modes' workers write their push logs (one test process runs one job at a time).
inline std::string push_log_prefix() { return "/tmp/dtrain_ps_pushes_" + std::to_string(::getpid()); }

inline void remove_push_logs(int workers) {
  for (int w = 0; w < workers; ++w) {
    for (const char* what : {".w", ".done"}) std::remove((push_log_prefix() + what + std::to_string(w)).c_str());
  }
}

// A job of 3 servers (k copies of each shard) and 2 workers in which server `killed` is
// SIGKILLed mid-job, about 300 ms in: it must finish without a restart, every other rank exiting
// 0. The model's three slices lie on shards 0, 0 and 2: server 0 heads the most. Under BSP worker
// 1 is slow, so a round mostly waits with worker 0's push acknowledged but not applied (what the
// worker must send the new head again); under ASP nobody sleeps, so pushes are always in flight,
// some applied and forwarded but not yet acknowledged (what the new head must not apply again).
// With `standby`, rank 5 is a standby server that takes the killed server's place; server
// `killed_later` (if any) is SIGKILLed too, a second later. With `late`, the standby is a
// process that joins the TCP group 600 ms after it formed (server 0 dead by then), and the
// later kill comes at 2 s.
// With `shards` > 3 the keys are cut into that many shards, and the model into 12 slices; with
// `growing` the standby adds capacity, taking shards j with j mod 4 = 3 when it comes.
struct failover_case {
  std::string mode;
  int replicas = 2;
  int killed = 0;
  bool leaves = false;
  bool standby = false;
  int killed_later = -1;
  bool late = false;
  int shards = 0;
  bool growing = false;
  int killed_later_ms = 0;  // when `killed_later` dies; 0: 1 s, or 2 s with `late`
};

inline group_run failover_run(const failover_case& c) {
  const auto [mode, replicas, killed, leaves, standby, killed_later, late, shards, growing, killed_later_ms] = c;
  // Under ASP the workers log every push for check_exactly_once's reference (the exact mode).
  if (mode == "asp") remove_push_logs(2);
  return run_ps(standby ? 6 : 5, mode == "asp" ? "asp-exact" : mode, [=](int) {
    std::vector<std::string> env{"DTRAIN_PS_SERVERS=3", "DTRAIN_TEST_REPLICAS=" + std::to_string(replicas),
                                 "DTRAIN_TEST_TIMEOUT_MS=10000", "DTRAIN_PS_STANDBY=" + std::to_string(standby ? 1 : 0),
                                 "DTRAIN_TEST_KILL_LATER_RANK=" + std::to_string(killed_later)};
    if (killed_later_ms > 0) env.push_back("DTRAIN_TEST_KILL_LATER_MS=" + std::to_string(killed_later_ms));
    if (shards > 0) {
      env.push_back("DTRAIN_PS_SHARDS=" + std::to_string(shards));
      env.emplace_back("DTRAIN_TEST_SLICE_BYTES=4");
    }
    if (growing) env.emplace_back("DTRAIN_PS_GROWING=1");
    if (late) {
      for (const char* e : {"DTRAIN_LATE_RANKS=1", "DTRAIN_TEST_LATE_MS=600"}) env.emplace_back(e);
      if (killed_later_ms == 0) env.emplace_back("DTRAIN_TEST_KILL_LATER_MS=2000");
    }
    if (leaves) {
      env.push_back("DTRAIN_TEST_LEAVE_RANK=" + std::to_string(killed));
    } else {
      env.push_back("DTRAIN_TEST_KILL_RANK=" + std::to_string(killed));
      env.push_back("DTRAIN_TEST_KILL_STEP=-1");
    }
    for (const char* e : mode == "bsp" ? std::vector<const char*>{"DTRAIN_TEST_SLOW_MS=20", "DTRAIN_TEST_SLOW_WORKER=1",
                                                                  late ? "DTRAIN_TEST_STEPS=140"
                                                                  : killed_later >= 0 ? "DTRAIN_TEST_STEPS=100"
                                                                                      : "DTRAIN_TEST_STEPS=60"}
                                       : std::vector<const char*>{"DTRAIN_TEST_STEPS=4000", "DTRAIN_TEST_N_PUSH=2"}) {
      env.emplace_back(e);
    }
    if (mode == "asp") env.push_back("DTRAIN_TEST_PUSH_LOG=" + push_log_prefix());
    return env;
  });
}

// What the exact modes' workers logged (ps_worker.cpp's push_log): each push's values, each
// step's begin and end, and the final pull.
struct push_record {
  std::map<std::pair<int, int>, std::vector<float>> pushes;      // by (worker, step)
  std::vector<std::map<int, std::pair<long long, long long>>> steps;  // [worker][step] = {begin, end} ns
  std::vector<std::vector<float>> finals;                        // each worker's final pull
};

inline push_record read_push_logs(int workers) {
  push_record r;
  r.steps.resize(static_cast<std::size_t>(workers));
  for (int w = 0; w < workers; ++w) {
    std::ifstream in(push_log_prefix() + ".w" + std::to_string(w));
    INFO("worker " << w << "'s push log");
    REQUIRE(in);
    for (std::string line; std::getline(in, line);) {
      std::istringstream l(line);
      std::string kind;
      l >> kind;
      if (kind == "step") {
        int it = 0;
        long long began = 0, ended = 0;
        l >> it >> began >> ended;
        r.steps[static_cast<std::size_t>(w)][it] = {began, ended};
        continue;
      }
      int who = 0, it = 0;
      l >> who;
      if (kind == "push") l >> it;
      std::vector<float> values;
      for (std::string v; l >> v;) values.push_back(std::strtof(v.c_str(), nullptr));
      if (kind == "final") {
        r.finals.push_back(values);
      } else {
        CHECK(r.pushes.emplace(std::pair(who, it), values).second);  // each push once in the logs
      }
    }
  }
  return r;
}

// Every push applied exactly once, against a reference the servers did not compute: the exact
// modes' servers run SGD (lr 2^-5) from x0 = 0 on pushes that are multiples of 2^-12, so every
// float sum is exact and the parameters are -lr * (the sum of every push the workers logged), in
// whatever order the servers applied them. Each worker's final pull, made once every worker's
// pushes were acknowledged, must hold exactly that: a push lost or applied twice moves it by at
// least 2^-17.
inline void check_exactly_once(int workers) {
  const push_record r = read_push_logs(workers);
  REQUIRE(r.finals.size() == static_cast<std::size_t>(workers));
  std::vector<long long> units(r.finals[0].size(), 0);  // the sum of the pushes, in units of 2^-12
  for (const auto& [id, values] : r.pushes) {
    REQUIRE(values.size() == units.size());
    for (std::size_t j = 0; j < units.size(); ++j) {
      const double u = std::ldexp(static_cast<double>(values[j]), 12);
      REQUIRE(u == std::nearbyint(u));
      units[j] += static_cast<long long>(u);
    }
  }
  std::vector<float> expected(units.size());
  for (std::size_t j = 0; j < units.size(); ++j)
    expected[j] = static_cast<float>(-std::ldexp(static_cast<double>(units[j]), -17));
  INFO(r.pushes.size() << " pushes logged");
  CHECK(r.pushes.size() > 100);
  for (std::size_t w = 0; w < r.finals.size(); ++w) {
    INFO("worker " << w << "'s final pull");
    CHECK(r.finals[w] == expected);
  }
  remove_push_logs(workers);  // read for the last time (kept where a REQUIRE stopped short)
}

// SSP(S)'s bound, from the workers' own step times on one clock (CLOCK_MONOTONIC): a worker's
// step `it` returns only after every other worker still in the job has begun its step it - S.
// A worker that had not entered yet or had ended has no such step and is not waited for. The
// lead (it, less the newest step the other had begun) must also reach S somewhere: else the run
// never pressed on the bound, and a job without one would pass as well.
inline void check_staleness_bound(const push_record& r, int bound) {
  int violations = 0, lead = 0;
  std::string first;
  for (std::size_t w = 0; w < r.steps.size(); ++w) {
    for (const auto& [it, times] : r.steps[w]) {
      for (std::size_t v = 0; v < r.steps.size(); ++v) {
        if (v == w) continue;
        auto behind = r.steps[v].find(it - bound);
        if (behind == r.steps[v].end()) continue;
        if (behind->second.first >= times.second && violations++ == 0) {
          first = "worker " + std::to_string(w) + " ended step " + std::to_string(it) + " before worker " +
                  std::to_string(v) + " began step " + std::to_string(it - bound);
        }
        while (std::next(behind) != r.steps[v].end() && std::next(behind)->second.first < times.second) ++behind;
        lead = std::max(lead, it - behind->first);
      }
    }
  }
  INFO(first);
  CHECK(violations == 0);
  CHECK(lead == bound);
}

// Both workers (ranks 3 and 4) report parameters equal to the serial simulation's.
inline void check_workers_match_simulation(const group_run& g) {
  for (int w : {3, 4}) {
    CHECK(has(g.ranks[static_cast<std::size_t>(w)].output, "parameters match the serial simulation"));
  }
}

inline void check_survivors(const group_run& g, int killed, int killed_later = -1) {
  REQUIRE(g.ranks[static_cast<std::size_t>(killed)].status == 128 + SIGKILL);
  if (killed_later >= 0) REQUIRE(g.ranks[static_cast<std::size_t>(killed_later)].status == 128 + SIGKILL);
  for (std::size_t r = 0; r < g.ranks.size(); ++r) {
    if (static_cast<int>(r) != killed && static_cast<int>(r) != killed_later) CHECK(g.ranks[r].status == 0);
  }
  CHECK(has(g.ranks[3].output, "server " + std::to_string(killed) + " is lost"));  // the worker saw it
}


// Server 0 left the job cleanly, rank `heir` heads its shard, and the workers match the simulation.
inline void check_server_0_left(const group_run& g, std::size_t heir = 1) {
  for (const auto& r : g.ranks) CHECK(r.status == 0);
  CHECK(has(g.ranks[0].output, "server 0 left the job"));
  CHECK(has(g.ranks[heir].output, "heads shard 0 now"));
  check_workers_match_simulation(g);
}

}  // namespace dtrain::fault_jobs
