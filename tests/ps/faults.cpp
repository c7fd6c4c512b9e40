// Parameter-server liveness across real processes: a worker SIGKILLed mid-run is dropped (ASP)
// or aborts the job naming it (BSP), and a dead server makes every worker fail naming it, within
// the deadline. Each test starts ps_worker processes itself.

#include <signal.h>

#include <cstdio>
#include <string>
#include <unistd.h>
#include <vector>

#include "../catch.hpp"
#include "../support/process_group.hpp"

using namespace dtrain;
using namespace dtrain::testing;

namespace {
template <class Extra>
group_run run_ps(int n, const std::string& mode, Extra extra) {
  return run_program_group(DTRAIN_PS_WORKER, n, mode, extra, nothing_during, 90s);
}
}  // namespace

TEST_CASE("ps faults: a dead worker is dropped under ASP and the others finish", "[ps][faults]") {
  auto g = run_ps(5, "asp", [](int) {
    return std::vector<std::string>{"DTRAIN_PS_SERVERS=2", "DTRAIN_TEST_KILL_RANK=3", "DTRAIN_TEST_KILL_STEP=10",
                                    "DTRAIN_TEST_POLICY=drop", "DTRAIN_TEST_HEARTBEAT_MS=1000", "DTRAIN_TEST_SLOW_MS=5"};
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
      std::vector<std::string> e{"DTRAIN_PS_SERVERS=2", "DTRAIN_TEST_CHECKPOINT=" + prefix, "DTRAIN_TEST_CHECKPOINT_EVERY=5",
                                 "DTRAIN_TEST_TIMEOUT_MS=3000", "DTRAIN_TEST_SLOW_MS=20"};
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
  for (int s = 0; s < 2; ++s) {
    for (int c = 0; c <= 30; c += 5) {
      for (const char* which : {"sparse", "dense"}) std::remove((prefix + ".shard" + std::to_string(s) + ".c" + std::to_string(c) + "." + which).c_str());
    }
  }
}
