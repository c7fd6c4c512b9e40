// Parameter-server membership across real processes: servers that leave cleanly or join the running
// job, standbys taking a lost server's place, late workers entering, and restarts from checkpoints
// around them, each ending exactly as the serial simulation (or applying every acknowledged push
// exactly once). Each test starts ps_worker processes itself; fault_jobs.hpp has the jobs.

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
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
#include "fault_jobs.hpp"

using namespace dtrain;
using namespace dtrain::testing;
using namespace dtrain::fault_jobs;

namespace {
// Every "copy of shard s: version v digest d" line of every rank, as shard -> [(version, digest)].
std::map<int, std::vector<std::pair<unsigned long long, unsigned long long>>> copies_in(const group_run& g) {
  std::map<int, std::vector<std::pair<unsigned long long, unsigned long long>>> copies;
  for (const auto& r : g.ranks) {
    for (std::size_t at = 0; (at = r.output.find("copy of shard ", at)) != std::string::npos; ++at) {
      int shard = 0;
      unsigned long long version = 0, digest = 0;
      if (std::sscanf(r.output.c_str() + at, "copy of shard %d: version %llu digest %llx", &shard, &version, &digest) ==
          3) {
        copies[shard].emplace_back(version, digest);
      }
    }
  }
  return copies;
}

// At the end each of `shards` shards has its k copies (`replicas`; 0: at least one, as many as
// the timing of a loss left), equal bit for bit (tables and updater state).
void check_k_copies(const group_run& g, std::size_t shards, int replicas) {
  const auto copies = copies_in(g);
  REQUIRE(copies.size() == shards);
  for (const auto& [shard, held] : copies) {
    INFO("shard " << shard);
    if (replicas > 0) {
      CHECK(held.size() == static_cast<std::size_t>(replicas));
    } else {
      REQUIRE(!held.empty());
    }
    for (const auto& copy : held) CHECK(copy == held[0]);
  }
}
}  // namespace

TEST_CASE("ps membership: a server that leaves cleanly hands its place to a standby first: its keys move there, every "
          "shard keeps its k copies, bit for bit as the serial simulation", "[ps][faults][membership]") {
  // 3 servers; server 0 leaves 300 ms in, and the standby (rank 5) joins its chains before it
  // goes. k = 2: server 0 heads shard 0 and is the tail of shard 2, and server 1 heads shard 0
  // after it. k = 1: server 0 holds shard 0 alone, which moves to the standby.
  const int replicas = GENERATE(1, 2);
  auto g = failover_run({.mode = "bsp", .replicas = replicas, .leaves = true, .standby = true});
  INFO(replicas << " replicas\n" << dump(g));
  check_server_0_left(g, replicas == 1 ? 5 : 1);
  const std::string& standby = g.ranks[5].output;
  CHECK(has(standby, "holds a copy of shard 0 now"));
  // The state of server 0's last shard came from server 0 itself: it was still there when the
  // standby joined.
  if (replicas == 2) CHECK(has(standby, "holds a copy of shard 2 now"));
  CHECK(has(standby, "from server 0)"));
  check_k_copies(g, 3, replicas);  // every shard has its k copies again
}


TEST_CASE("ps membership: a server added to the running job takes its share of the shards from their first copies, k "
          "copies throughout, bit for bit as the serial simulation under BSP and exactly once under ASP",
          "[ps][faults][membership]") {
  // 3 servers and 8 shards; the growing standby (rank 5) joins the TCP group 600 ms in and grows
  // the job to 4 servers: shards 3 and 7 (j mod 4 = 3; one and three of the model's 12 slices)
  // move to it from servers 0 and 1, whose first copies they were. k = 2: shard 3's chain 0 -> 1 becomes 1 -> 5, shard
  // 7's 1 -> 2 becomes 2 -> 5.
  const int replicas = GENERATE(1, 2);
  const std::string mode = GENERATE("bsp", "asp");
  auto g = failover_run(
      {.mode = mode, .replicas = replicas, .killed = -1, .standby = true, .late = true, .shards = 8, .growing = true});
  INFO(mode << ", " << replicas << " replicas\n" << dump(g));
  for (const auto& r : g.ranks) CHECK(r.status == 0);
  const std::string& grown = g.ranks[5].output;
  const int heir[] = {replicas == 1 ? 5 : 1, replicas == 1 ? 5 : 2};  // who heads shards 3 and 7 after the move
  for (int i = 0; i < 2; ++i) {
    const int shard = i == 0 ? 3 : 7;
    INFO("shard " << shard);
    CHECK(has(grown, "holds a copy of shard " + std::to_string(shard) + " now"));
    CHECK(has(g.ranks[static_cast<std::size_t>(i)].output, "gives shard " + std::to_string(shard) + " "));
    CHECK(!has(g.ranks[static_cast<std::size_t>(i)].output,
               "gives shard " + std::to_string(shard) + " (version 0)"));  // mid-job
    CHECK(!has(g.ranks[static_cast<std::size_t>(i)].output,
               "copy of shard " + std::to_string(shard) + ":"));  // gave it up
    CHECK(has(g.ranks[static_cast<std::size_t>(heir[i])].output, "heads shard " + std::to_string(shard) + " now"));
  }
  check_k_copies(g, 8, replicas);
  if (mode == "asp") return check_exactly_once(2);
  check_workers_match_simulation(g);
}

TEST_CASE(
    "ps membership: a server added to the running job while another is SIGKILLed, the shards moving to it from the "
    "lost one too, bit for bit as the serial simulation under BSP and exactly once under ASP",
    "[ps][faults][membership]") {
  // As above (3 servers, 8 shards, k = 2, the growing standby joining 600 ms in for shards 3 and
  // 7), and server 0, the first copy of shard 3 and so the one to hand it over, is SIGKILLed
  // 560 or 700 ms after it started: on this machine, mostly before it gave shard 3 away and
  // after, but the order is the timing's, and either must hold. The growing server, a standby
  // too, then also takes server 0's place in its chains. No update is lost or applied twice, and
  // every shard's copies agree.
  const std::string mode = GENERATE("bsp", "asp");
  const int kill_ms = GENERATE(560, 700);
  auto g = failover_run({.mode = mode, .killed = -1, .standby = true, .killed_later = 0, .late = true, .shards = 8,
                         .growing = true, .killed_later_ms = kill_ms});
  INFO(mode << ", server 0 killed at " << kill_ms << " ms, "
            << (has(g.ranks[0].output, "gives shard 3") ? "after" : "before") << " it gave shard 3 away\n" << dump(g));
  check_survivors(g, 0);
  for (int shard : {3, 7, 0}) CHECK(has(g.ranks[5].output, "holds a copy of shard " + std::to_string(shard) + " now"));
  check_k_copies(g, 8, 0);
  if (mode == "asp") return check_exactly_once(2);
  check_workers_match_simulation(g);
}

TEST_CASE(
    "ps fail-over: a standby server, started with the job or joining the running group later, joins the chains of a "
    "server SIGKILLed under BSP, the job ends bit for bit as the serial simulation with k copies of every shard again",
    "[ps][faults][failover]") {
  // k = 2: server 0 holds shards 0 (head) and 2 (tail); server 2 holds shards 2 (head) and 1 (tail).
  // Killing server 1 a second after server 0 leaves the standby the only copy of shard 0: it
  // heads it, and the workers find it.
  // Late: the standby is a process that joins the running TCP group after server 0 is dead.
  const auto [killed, killed_later, late] =
      GENERATE(std::tuple{0, -1, false}, std::tuple{2, -1, false}, std::tuple{0, 1, false}, std::tuple{0, 1, true});
  auto g = failover_run({.mode = "bsp", .killed = killed, .standby = true, .killed_later = killed_later, .late = late});
  INFO("server " << killed << " killed, then server " << killed_later << (late ? ", the standby joining late" : "")
                 << "\n"
                 << dump(g));
  check_survivors(g, killed, killed_later);
  check_workers_match_simulation(g);
  const std::string& standby = g.ranks[5].output;
  for (int s : {killed, (killed + 2) % 3}) {
    CHECK(has(standby, "holds a copy of shard " + std::to_string(s) + " now"));
  }
  if (killed_later >= 0) CHECK(has(standby, "heads shard " + std::to_string(killed) + " now"));
  if (late) CHECK(has(standby, "rank 0 did not answer rank 5 joining the group late"));
  // Every shard has two copies at the end (one, of those a second loss left one), equal bit
  // for bit, tables and updater state.
  const auto copies = copies_in(g);
  REQUIRE(copies.size() == 3);
  for (const auto& [shard, held] : copies) {
    INFO("shard " << shard);
    REQUIRE(held.size() == (killed_later >= 0 && shard != 2 ? 1u : 2u));
    for (const auto& copy : held) CHECK(copy == held[0]);
  }
}

TEST_CASE(
    "ps membership: a worker that leaves mid-job under BSP, the others go on averaging over themselves, bit for bit "
    "as the serial simulation",
    "[ps][faults][membership]") {
  const int replicas = GENERATE(1, 2);
  auto g = run_ps(5, "bsp", [=](int) {
    return std::vector<std::string>{"DTRAIN_PS_SERVERS=2", "DTRAIN_TEST_REPLICAS=" + std::to_string(replicas),
                                    "DTRAIN_TEST_LEAVE_WORKER=1", "DTRAIN_TEST_LEAVE_AFTER=10", "DTRAIN_TEST_STEPS=30",
                                    "DTRAIN_TEST_SLOW_MS=5", "DTRAIN_TEST_SLOW_WORKER=0"};
  });
  INFO(replicas << " replicas\n" << dump(g));
  for (const auto& r : g.ranks) CHECK(r.status == 0);
  CHECK(has(g.ranks[3].output, "10 steps: worker 1's parameters match the serial simulation"));
  for (int w : {2, 4}) CHECK(has(g.ranks[static_cast<std::size_t>(w)].output, "30 steps"));
  for (int w : {2, 4})
    CHECK(has(g.ranks[static_cast<std::size_t>(w)].output, "parameters match the serial simulation"));
}

namespace {
// The clock a late worker printed it entered the running job at; -1 if it did not.
long long entered_at(const std::string& out) {
  return number_after(out, "entered the running job at clock ").value_or(-1);
}

// The step worker 0 printed it resumed at; -1 if it did not.
long long resumed_at(const std::string& out) { return number_after(out, "worker 0 resumes at step ").value_or(-1); }

// The files through which the harness decides the clock a late worker enters a BSP job at
// (ps_worker.cpp's DTRAIN_TEST_ENTER_AT): worker 0 holds a round open until the late worker has
// entered, so the serial simulation's entry clock is the harness's, not the worker's report.
struct late_entry {
  std::string hold, joined;
  explicit late_entry(const std::string& name)
      : hold("/tmp/dtrain_ps_" + name + "_" + std::to_string(::getpid()) + ".hold"), joined(hold + ".joined") {
    clear();
  }
  ~late_entry() { clear(); }
  void clear() const {
    std::remove(hold.c_str());
    std::remove(joined.c_str());
  }
  std::vector<std::string> env(long long at) const {  // (clear() between two runs)
    return {"DTRAIN_TEST_ENTER_AT=" + std::to_string(at), "DTRAIN_TEST_HOLD_FILE=" + hold,
            "DTRAIN_TEST_JOIN_FILE=" + joined};
  }
};

// The newest clock (a multiple of 5 up to `last`) of which each of `shards` shards has both
// checkpoint files under `prefix`, read from the files' names; -1 if none.
long long newest_checkpoint(const std::string& prefix, int shards, int last) {
  for (int c = last - last % 5; c >= 0; c -= 5) {
    bool every = true;
    for (int s = 0; s < shards; ++s) {
      for (const char* which : {"sparse", "dense"}) {
        every = every && ::access(checkpoint_file(prefix, s, c, which).c_str(), F_OK) == 0;
      }
    }
    if (every) return c;
  }
  return -1;
}
}  // namespace

TEST_CASE(
    "ps membership: a worker that joins the running job under ASP or SSP (a late TCP rank) trains with the others, "
    "every push applied once",
    "[ps][faults][membership]") {
  // 2 servers, 3 workers; worker 2 is a process that joins the group 300 ms in, while the
  // others are mid-run (1000 steps, 1 ms apart). Under SSP(2) it enters at a clock past every
  // round in progress; the others then stay within 2 clocks of it. Every push is applied once
  // (check_exactly_once's reference, from the workers' logs) and, under SSP, the bound holds by
  // the workers' own step times.
  const std::string mode = GENERATE("asp", "ssp");
  remove_push_logs(3);
  auto g = run_ps(5, mode + "-exact", [&](int) {
    return std::vector<std::string>{"DTRAIN_PS_SERVERS=2", "DTRAIN_PS_LATE_WORKERS=1", "DTRAIN_LATE_RANKS=1",
                                    "DTRAIN_TEST_LATE_MS=300", "DTRAIN_TEST_STEPS=1000", "DTRAIN_TEST_SLOW_MS=1",
                                    // under SSP worker 0 is slower, so the others press on the bound
                                    mode == "ssp" ? "DTRAIN_TEST_SLOW_WORKER=0" : "DTRAIN_TEST_SLOW_WORKER=-1",
                                    "DTRAIN_TEST_N_PUSH=" + std::string(mode == "asp" ? "2" : "1"),
                                    "DTRAIN_TEST_PUSH_LOG=" + push_log_prefix()};
  });
  INFO(mode);
  INFO(dump(g));
  for (const auto& r : g.ranks) CHECK(r.status == 0);
  for (int w : {2, 3, 4}) CHECK(has(g.ranks[static_cast<std::size_t>(w)].output, "final loss"));
  // It came while the others ran (the processes start together; it waits 300 ms to connect).
  auto at = [&](int rank, const char* what) {
    long long ms = -1;
    const std::string& out = g.ranks[static_cast<std::size_t>(rank)].output;
    const auto p = out.find(std::string("worker ") + std::to_string(rank - 2) + " " + what + " at ");
    if (p != std::string::npos)
      std::sscanf(out.c_str() + p, ("worker %*d " + std::string(what) + " at %lld").c_str(), &ms);
    return ms;
  };
  CHECK(entered_at(g.ranks[4].output) > 0);
  CHECK(at(4, "began") >= 300);
  CHECK(at(4, "began") < at(2, "ended"));
  CHECK(at(4, "began") < at(3, "ended"));
  if (mode == "ssp") check_staleness_bound(read_push_logs(3), 2);
  check_exactly_once(3);  // and removes the logs
}

TEST_CASE(
    "ps membership: a worker that joins the running job under BSP enters at a round every shard agrees on, bit for "
    "bit as the serial simulation",
    "[ps][faults][membership]") {
  // 2 servers, 3 workers; worker 2 is a late worker and a late TCP rank, a process that connects
  // 300 ms in, while the others run 60 rounds about 10 ms apart. Every worker, the joiner too,
  // checks its parameters against synchronous SGD with worker 2 counted from the round it entered.
  // Worker 0 holds round 7 open until worker 2 entered: worker 2 must enter at 8.
  const int replicas = GENERATE(1, 2);
  const late_entry entry("join");
  auto g = run_ps(5, "bsp", [&](int) {
    std::vector<std::string> env{"DTRAIN_PS_SERVERS=2", "DTRAIN_PS_LATE_WORKERS=1", "DTRAIN_LATE_RANKS=1",
                                 "DTRAIN_TEST_LATE_MS=300", "DTRAIN_TEST_STEPS=60", "DTRAIN_TEST_SLOW_MS=10",
                                 "DTRAIN_TEST_REPLICAS=" + std::to_string(replicas)};
    for (auto& e : entry.env(8)) env.push_back(e);
    return env;
  });
  INFO(replicas << " replicas\n" << dump(g));
  for (const auto& r : g.ranks) CHECK(r.status == 0);
  for (int w : {2, 3, 4}) {
    CHECK(has(g.ranks[static_cast<std::size_t>(w)].output, "60 steps: worker " + std::to_string(w - 2) +
                                                                  "'s parameters match the serial simulation"));
  }
  CHECK(entered_at(g.ranks[4].output) == 8);
}

TEST_CASE("ps membership: a job restarted from its checkpoints after a late worker had entered it lets that worker "
          "enter again, bit for bit as the serial simulation", "[ps][faults][membership][checkpoint]") {
  // 2 servers, 3 workers; worker 2 is a late worker, a process that connects 300 ms in, and each
  // shard writes a checkpoint every 5 clocks. Server 1 dies 1.5 s in, after worker 2 entered,
  // and the workers fail. Restarted with the same roles, the job resumes at the newest clock
  // every shard has; worker 2, late again, enters again. The checkpoints do not mark it present,
  // so the rounds from the resumed clock to its second arrival are averaged over the other two.
  // Every worker checks its parameters against the serial simulation with worker 2 counted
  // from its first arrival to the resumed clock, and from its second arrival on.
  // The harness decides both entries (worker 0 holds round 10 open, then round resumed + 2) and
  // reads the clock the job resumes at from the checkpoint files' names.
  const std::string prefix = "/tmp/dtrain_ps_late_restart_" + std::to_string(::getpid());
  const late_entry entry("late_restart");
  const long long first_join = 11;
  auto env = [&](long long resumed) {
    return [=, &entry](int) {
      std::vector<std::string> e{"DTRAIN_PS_SERVERS=2",
                                 "DTRAIN_PS_LATE_WORKERS=1",
                                 "DTRAIN_LATE_RANKS=1",
                                 "DTRAIN_TEST_LATE_MS=300",
                                 "DTRAIN_TEST_CHECKPOINT=" + prefix,
                                 "DTRAIN_TEST_CHECKPOINT_EVERY=5",
                                 "DTRAIN_TEST_TIMEOUT_MS=3000",
                                 "DTRAIN_TEST_STEPS=140",
                                 "DTRAIN_TEST_SLOW_MS=20"};
      for (auto& v : entry.env(resumed < 0 ? first_join : resumed + 3)) e.push_back(v);
      if (resumed < 0) {
        e.emplace_back("DTRAIN_TEST_KILL_LATER_RANK=1");
        e.emplace_back("DTRAIN_TEST_KILL_LATER_MS=1500");
      } else {
        e.emplace_back("DTRAIN_TEST_RESUME=1");
        e.emplace_back("DTRAIN_TEST_FIRST_JOIN=" + std::to_string(first_join));
        e.emplace_back("DTRAIN_TEST_RESUMED_AT=" + std::to_string(resumed));
      }
      return e;
    };
  };
  remove_checkpoints(prefix);  // none left by an earlier process of this pid
  REQUIRE(newest_checkpoint(prefix, 2, 140) == -1);
  auto first = run_ps(5, "bsp", env(-1));
  INFO(dump(first));
  REQUIRE(first.ranks[1].status == 128 + SIGKILL);
  REQUIRE(entered_at(first.ranks[4].output) == first_join);
  const long long resumed = newest_checkpoint(prefix, 2, 140);
  REQUIRE(resumed > first_join);  // the case meant: it had been there before the checkpoint
  entry.clear();
  auto second = run_ps(5, "bsp", env(resumed));
  INFO("the checkpoints resume the job at clock " << resumed << "\n" << dump(second));
  for (const auto& r : second.ranks) CHECK(r.status == 0);
  CHECK(resumed_at(second.ranks[2].output) == resumed);
  CHECK(entered_at(second.ranks[4].output) == resumed + 3);
  for (int w : {2, 3, 4}) {
    CHECK(has(second.ranks[static_cast<std::size_t>(w)].output, "140 steps: worker " + std::to_string(w - 2) +
                                                                       "'s parameters match the serial simulation"));
  }
  remove_checkpoints(prefix);
}

TEST_CASE("ps membership: a worker that joins the running job while a server is SIGKILLed, bit for bit as the serial "
          "simulation under BSP and exactly once under ASP", "[ps][faults][membership]") {
  // 3 servers (k = 2) and 2 workers; worker 1 is a late worker and a late TCP rank that connects
  // 300 ms in, and server 0 is SIGKILLed 250 or 400 ms after it started: about as the joiner
  // says hello, before or after it enters, as the timing falls. The joiner's hello and entry
  // reach the new head of server 0's shard either way: every survivor ends well.
  const std::string mode = GENERATE("bsp", "asp");
  const int kill_ms = GENERATE(250, 400);
  const late_entry entry("join_kill");  // under BSP worker 0 holds round 5 open: the joiner enters at 6
  remove_push_logs(2);
  auto g = run_ps(5, mode == "asp" ? "asp-exact" : mode, [&](int) {
    std::vector<std::string> env{"DTRAIN_PS_SERVERS=3",
                                 "DTRAIN_TEST_REPLICAS=2",
                                 "DTRAIN_PS_LATE_WORKERS=1",
                                 "DTRAIN_LATE_RANKS=1",
                                 "DTRAIN_TEST_LATE_MS=300",
                                 "DTRAIN_TEST_KILL_LATER_RANK=0",
                                 "DTRAIN_TEST_KILL_LATER_MS=" + std::to_string(kill_ms),
                                 "DTRAIN_TEST_TIMEOUT_MS=10000"};
    if (mode == "bsp") {
      for (auto& e : entry.env(6)) env.push_back(e);
    }
    for (const char* e : mode == "bsp" ? std::vector<const char*>{"DTRAIN_TEST_STEPS=60", "DTRAIN_TEST_SLOW_MS=10"}
                                       : std::vector<const char*>{"DTRAIN_TEST_STEPS=1000", "DTRAIN_TEST_SLOW_MS=1",
                                                                  "DTRAIN_TEST_N_PUSH=2"}) {
      env.emplace_back(e);
    }
    env.push_back("DTRAIN_TEST_PUSH_LOG=" + push_log_prefix());
    return env;
  });
  INFO(mode << ", server 0 killed at " << kill_ms << " ms\n" << dump(g));
  check_survivors(g, 0);
  if (mode == "asp") {
    CHECK(entered_at(g.ranks[4].output) > 0);
    return check_exactly_once(2);
  }
  CHECK(entered_at(g.ranks[4].output) == 6);
  check_workers_match_simulation(g);
}
