// Parameter-server liveness across real processes: a worker SIGKILLed mid-run is dropped (ASP)
// or aborts the job naming it (BSP), and a dead server makes every worker fail naming it, within
// the deadline; with replicated shards a dead server is a fail-over instead, which loses no
// acknowledged push and applies none twice. Each test starts ps_worker processes itself.
// Kills that change the job (membership: servers and workers leaving, joining, growing) are in
// membership.cpp; the jobs and checks both use are in fault_jobs.hpp.

#include <signal.h>

#include <string>
#include <vector>

#include "../catch.hpp"
#include "../support/program_group.hpp"
#include "fault_jobs.hpp"

using namespace dtrain;
using namespace dtrain::testing;
using namespace dtrain::fault_jobs;

TEST_CASE("ps faults: a dead worker is dropped under ASP and the others finish", "[ps][faults]") {
  auto g = run_ps(5, "asp", [](int) {
    return std::vector<std::string>{"DTRAIN_PS_SERVERS=2",           "DTRAIN_TEST_KILL_RANK=3",
                                    "DTRAIN_TEST_KILL_STEP=10",      "DTRAIN_TEST_POLICY=drop",
                                    "DTRAIN_TEST_HEARTBEAT_MS=1000", "DTRAIN_TEST_SLOW_MS=5"};
  });
  INFO(dump(g));
  CHECK(g.ranks[3].status == 128 + SIGKILL);
  for (int r : {0, 1, 2, 4}) CHECK(g.ranks[static_cast<std::size_t>(r)].status == 0);
  CHECK((has(g.ranks[0].output, "dropping worker 1 (rank 3)") || has(g.ranks[1].output, "dropping worker 1 (rank 3)")));
}

TEST_CASE("ps faults: a dead worker under BSP aborts the job, everyone naming it", "[ps][faults]") {
  auto g = run_ps(4, "bsp", [](int) {
    return std::vector<std::string>{"DTRAIN_PS_SERVERS=2", "DTRAIN_TEST_KILL_RANK=3", "DTRAIN_TEST_KILL_STEP=5",
                                    "DTRAIN_TEST_HEARTBEAT_MS=1000"};
  });
  INFO(dump(g));
  CHECK(g.ranks[3].status == 128 + SIGKILL);
  for (int r : {0, 1, 2}) {
    const auto& o = g.ranks[static_cast<std::size_t>(r)];
    CHECK(o.status == 3);
    CHECK(has(o.output, "worker 1 (rank 3) sent nothing for"));
  }
  CHECK(g.elapsed < 30s);
}

TEST_CASE("ps faults: a dead server makes every worker fail naming it, within the deadline", "[ps][faults]") {
  auto g = run_ps(4, "asp", [](int) {
    return std::vector<std::string>{"DTRAIN_PS_SERVERS=2", "DTRAIN_TEST_KILL_RANK=1", "DTRAIN_TEST_KILL_STEP=0",
                                    "DTRAIN_TEST_TIMEOUT_MS=5000", "DTRAIN_TEST_STEPS=100000", "DTRAIN_TEST_SLOW_MS=1"};
  });
  INFO(dump(g));
  CHECK(g.ranks[1].status == 128 + SIGKILL);
  for (int r : {2, 3}) {
    const auto& o = g.ranks[static_cast<std::size_t>(r)];
    CHECK(o.status == 3);
    CHECK(has(o.output, "server 1"));
  }
  CHECK(g.elapsed < 40s);
}

TEST_CASE("ps faults: a server SIGKILLed mid-job, the job restarted from the checkpoints ends exactly right",
          "[ps][faults][checkpoint]") {
  const std::string prefix = "/tmp/dtrain_ps_restart_" + std::to_string(::getpid());
  auto env = [&](bool resume) {
    return [=](int) {
      std::vector<std::string> e{"DTRAIN_PS_SERVERS=2", "DTRAIN_TEST_CHECKPOINT=" + prefix,
                                 "DTRAIN_TEST_CHECKPOINT_EVERY=5", "DTRAIN_TEST_TIMEOUT_MS=3000",
                                 "DTRAIN_TEST_SLOW_MS=20"};
      if (!resume) {
        e.push_back("DTRAIN_TEST_KILL_RANK=1");  // server 1 dies about 300 ms in, mid-run
        e.push_back("DTRAIN_TEST_KILL_STEP=-2");
      } else {
        e.push_back("DTRAIN_TEST_RESUME=1");
      }
      return e;
    };
  };
  auto first = run_ps(4, "bsp", env(false));
  INFO(dump(first));
  REQUIRE(first.ranks[1].status == 128 + SIGKILL);
  CHECK(first.ranks[2].status == 3);  // the workers fail, naming the server
  auto second = run_ps(4, "bsp", env(true));
  INFO(dump(second));
  for (const auto& r : second.ranks) CHECK(r.status == 0);
  CHECK(has(second.ranks[2].output, "worker 0 resumes at step"));
  CHECK(has(second.ranks[2].output, "worker 0's parameters match the serial simulation"));
  CHECK(has(second.ranks[3].output, "worker 1's parameters match the serial simulation"));
  remove_checkpoints(prefix);
}

TEST_CASE(
    "ps faults: a job that grew by a server, SIGKILLed mid-job and restarted from the checkpoints, grows again and "
    "ends exactly right",
    "[ps][faults][checkpoint][membership]") {
  // 3 servers, 8 shards (k = 1), and a growing standby that connects 600 ms in and takes shards
  // 3 and 7; every 5 clocks each shard's head (the new server, for those two) writes its
  // checkpoint. Server 2 dies 2 s in, and the workers fail. Restarted with the same roles, the
  // servers load the newest clock every shard has, the new server grows the job again (shards 3
  // and 7 move to it from the state their first copies loaded), and the workers match the serial
  // simulation of the whole run.
  const std::string prefix = "/tmp/dtrain_ps_grow_restart_" + std::to_string(::getpid());
  auto env = [&](bool resume) {
    return [=](int) {
      std::vector<std::string> e{"DTRAIN_PS_SERVERS=3",
                                 "DTRAIN_PS_STANDBY=1",
                                 "DTRAIN_PS_GROWING=1",
                                 "DTRAIN_PS_SHARDS=8",
                                 "DTRAIN_TEST_SLICE_BYTES=4",
                                 "DTRAIN_LATE_RANKS=1",
                                 "DTRAIN_TEST_LATE_MS=600",
                                 "DTRAIN_TEST_CHECKPOINT=" + prefix,
                                 "DTRAIN_TEST_CHECKPOINT_EVERY=5",
                                 "DTRAIN_TEST_TIMEOUT_MS=3000",
                                 "DTRAIN_TEST_STEPS=140",
                                 "DTRAIN_TEST_SLOW_MS=20",
                                 "DTRAIN_TEST_SLOW_WORKER=1"};
      if (!resume) {
        e.emplace_back("DTRAIN_TEST_KILL_LATER_RANK=2");
        e.emplace_back("DTRAIN_TEST_KILL_LATER_MS=2000");
      } else {
        e.emplace_back("DTRAIN_TEST_RESUME=1");
      }
      return e;
    };
  };
  auto first = run_ps(6, "bsp", env(false));
  INFO(dump(first));
  REQUIRE(first.ranks[2].status == 128 + SIGKILL);
  CHECK(has(first.ranks[5].output, "holds a copy of shard 3 now"));
  auto second = run_ps(6, "bsp", env(true));
  INFO(dump(second));
  for (const auto& r : second.ranks) CHECK(r.status == 0);
  CHECK(has(second.ranks[3].output, "worker 0 resumes at step"));
  for (int shard : {3, 7})
    CHECK(has(second.ranks[5].output, "holds a copy of shard " + std::to_string(shard) + " now"));
  CHECK(has(second.ranks[3].output, "worker 0's parameters match the serial simulation"));
  CHECK(has(second.ranks[4].output, "worker 1's parameters match the serial simulation"));
  remove_checkpoints(prefix);
}

TEST_CASE("ps fail-over: a server SIGKILLed under BSP, the job ends bit for bit as the serial simulation",
          "[ps][faults][failover]") {
  // Server 0 is the head of shard 0 and the tail of shard 2 (k = 2), or the head of shard 0, the
  // middle of shard 2's chain and the tail of shard 1's (k = 3); server 2 heads shard 2.
  const int replicas = GENERATE(2, 3);
  const int killed = GENERATE(0, 2);
  auto g = failover_run({.mode = "bsp", .replicas = replicas, .killed = killed});
  INFO(replicas << " replicas, server " << killed << " killed\n" << dump(g));
  check_survivors(g, killed);
  check_workers_match_simulation(g);
  const int next = (killed + 1) % 3;  // the next copy in the dead server's own chain
  CHECK(has(g.ranks[static_cast<std::size_t>(next)].output, "heads shard " + std::to_string(killed) + " now"));
}

TEST_CASE("ps fail-over: a server SIGKILLed under ASP, every acknowledged push applied exactly once",
          "[ps][faults][failover]") {
  const int replicas = GENERATE(2, 3);
  const int killed = GENERATE(0, 2);
  auto g = failover_run({.mode = "asp", .replicas = replicas, .killed = killed});
  INFO(replicas << " replicas, server " << killed << " killed\n" << dump(g));
  check_survivors(g, killed);
  check_exactly_once(2);
  CHECK(
      has(g.ranks[static_cast<std::size_t>(killed + 1) % 3].output, "heads shard " + std::to_string(killed) + " now"));
}

TEST_CASE(
    "ps fail-over: with more shards than servers (7 on 3), a server SIGKILLed takes every shard it headed to the next "
    "copies, bit for bit under BSP, exactly once under ASP",
    "[ps][faults][failover]") {
  const std::string mode = GENERATE("bsp", "asp");
  auto g = failover_run({.mode = mode, .killed = 0, .shards = 7});
  INFO(mode << "\n" << dump(g));
  check_survivors(g, 0);
  for (int shard : {0, 3, 6}) CHECK(has(g.ranks[1].output, "heads shard " + std::to_string(shard) + " now"));
  if (mode == "asp") return check_exactly_once(2);
  check_workers_match_simulation(g);
}

TEST_CASE(
    "ps fail-over: a server that leaves cleanly mid-job under BSP, the job ends bit for bit as the serial simulation",
    "[ps][faults][failover]") {
  auto g = failover_run({.mode = "bsp", .leaves = true});
  INFO(dump(g));
  check_server_0_left(g);
}

