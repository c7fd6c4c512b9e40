// Faults across real processes over shared memory: each test starts tcp_worker processes with
// DTRAIN_TEST_TRANSPORT=shm (a store served here, as dtrain-run does), injects the fault, and
// checks every survivor's exit status and words, how long it took, and that /dev/shm holds no
// segment of the job, neither while it runs (nobody else can open one) nor after it died.

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>

#include "../catch.hpp"
#include "../support/program_group.hpp"
#include "../support/shm_segments.hpp"

using namespace dtrain;
using namespace dtrain::testing;
using namespace std::chrono_literals;

namespace {

template <class Extra, class During>
group_run run_shm_group(int n, const std::string& mode, Extra extra, During during) {
  return run_program_group(DTRAIN_TCP_WORKER, n, mode, [&](int r) {
    auto env = extra(r);
    env.push_back("DTRAIN_TEST_TRANSPORT=shm");
    return env;
  }, during, 60s);
}

}  // namespace

TEST_CASE(
    "shm faults: a rank SIGKILLed mid-allreduce fails every survivor within 100 ms naming it and leaves nothing in "
    "/dev/shm",
    "[shm][faults]") {
  std::vector<testing::mapped_segment> mapped;
  bool listed_while_running = false;
  auto g = run_shm_group(4, "allreduce-loop", [](int) {
    return std::vector<std::string>{"DTRAIN_TEST_KILL_RANK=2", "DTRAIN_TEST_KILL_AFTER_MS=1500",
                                    "DTRAIN_TEST_LOOP_MS=20000"};
  }, [&](tcp_store_server&, const std::vector<pid_t>& pids) {
    // Once formed, every process maps the segments and their names are gone: look until then,
    // or until just before rank 2 dies.
    const auto give_up = std::chrono::steady_clock::now() + 1200ms;
    auto formed = [&] {
      return !mapped.empty() && std::all_of(mapped.begin(), mapped.end(), [](const auto& s) { return s.unlinked; });
    };
    do {
      std::this_thread::sleep_for(10ms);
      mapped = segments_mapped_by(pids);
    } while (!formed() && std::chrono::steady_clock::now() < give_up);
    for (const auto& s : mapped) listed_while_running = listed_while_running || listed_in_dev_shm(s.name);
  });
  INFO(dump(g));
  CHECK(g.ranks[2].status == 128 + SIGKILL);
  const auto died = number_after(g.ranks[2].output, "dying at monotonic ");
  REQUIRE(died);
  long long slowest_us = 0;
  for (int r : {0, 1, 3}) {
    const auto& o = g.ranks[static_cast<std::size_t>(r)];
    CHECK(o.status == 3);
    CHECK(has(o.output, "[peer lost]"));
    CHECK(has(o.output, "rank 2 (pid"));
    CHECK(has(o.output, "exited without leaving the group"));
    const auto caught = number_after(o.output, "(at monotonic ");
    REQUIRE(caught);
    slowest_us = std::max(slowest_us, *caught - *died);
  }
  INFO("the slowest survivor reported the death after " << slowest_us / 1000 << " ms");
  CHECK(slowest_us < 100'000);
  REQUIRE(!mapped.empty());
  for (const auto& s : mapped) {
    INFO(s.name);
    CHECK(s.unlinked);  // a second job finds no name to open
    CHECK(!listed_in_dev_shm(s.name));
  }
  CHECK(!listed_while_running);
}

TEST_CASE("shm faults: a message sent before its sender died is still delivered", "[shm][faults]") {
  auto g = run_shm_group(2, "send-then-die", no_extra, nothing_during);
  INFO(dump(g));
  CHECK(g.ranks[1].status == 128 + SIGKILL);
  CHECK(g.ranks[0].status == 0);
  CHECK(has(g.ranks[0].output, "still arrived: 42"));
}

TEST_CASE("shm faults: mismatched collectives across processes name both sides", "[shm][faults]") {
  auto g = run_shm_group(2, "mismatch", no_extra, nothing_during);
  INFO(dump(g));
  check_mismatch_verdicts(g);
}

TEST_CASE("shm faults: a rank of another job (another token) cannot join and says why", "[shm][faults]") {
  auto g = run_shm_group(2, "allreduce-loop", [](int r) {
    return r == 1 ? std::vector<std::string>{"DTRAIN_TOKEN=another-job", "DTRAIN_TIMEOUT_MS=3000"}
                  : std::vector<std::string>{"DTRAIN_TIMEOUT_MS=3000"};
  }, nothing_during);
  INFO(dump(g));
  CHECK(g.ranks[1].status == 3);
  CHECK(has(g.ranks[1].output, "token"));
  CHECK(g.ranks[0].status == 3);
  CHECK(g.elapsed < 15s);
}
