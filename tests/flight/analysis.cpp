// The flight recorder's analysis, against hand-written dumps whose answer is known: the first call
// where ranks disagree, the rank behind, and a message waited for in vain. The real-process cases
// are tools/flight_recorder.sh's.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../catch.hpp"
#include "../../tools/flight_analysis.hpp"

namespace analysis = dtrain_tools::flight;

namespace {

analysis::call_record record(int rank, std::uint64_t seq, const std::string& op, std::uint64_t count,
                             const std::string& state = "completed", const std::string& group = "world", int root = 0) {
  analysis::call_record c;
  c.rank = rank;
  c.seq = seq;
  c.op = op;
  c.count = count;
  c.state = state;
  c.group = group;
  c.root = root;
  c.dtype = "float32";
  c.redop = "sum";
  c.group_size = 3;
  c.start_us = 1000 + static_cast<std::int64_t>(seq) * 10;
  c.end_us = state == "completed" ? c.start_us + 5 : 0;
  return c;
}

// Every call of `dumps` in a world (and group) of `n` ranks.
void in_world_of(int n, std::vector<analysis::dump>& dumps) {
  for (auto& d : dumps) {
    for (auto& c : d.calls) c.group_size = n;
  }
}

analysis::dump dump_of(int rank, std::vector<analysis::call_record> calls, std::string reason = "exit") {
  analysis::dump d;
  d.rank = rank;
  d.reason = reason;
  d.first = reason;
  d.dumped_us = 5000;
  d.calls = std::move(calls);
  return d;
}

}  // namespace

namespace {

analysis::call_record message(int rank, int peer, bool send, std::uint64_t k, std::uint64_t tag,
                              const std::string& state = "completed") {
  auto c = record(rank, k, "message", 16, state);
  c.peer = peer;
  c.dir = send ? "send" : "recv";
  c.tag = tag;
  return c;
}

}  // namespace
TEST_CASE("flight: the analysis names the first call where the ranks disagree, by root too", "[flight]") {
  std::vector<analysis::dump> dumps;
  for (int r = 0; r < 3; ++r) {
    dumps.push_back(dump_of(r, {record(r, 0, "allreduce", 8),
                                record(r, 1, "broadcast", 8, "failed", "world", r == 1 ? 2 : 0),
                                record(r, 2, "allreduce", r == 0 ? 9 : 8, "failed")}));
  }
  const auto findings = analysis::analyze(dumps, {3, {}});
  REQUIRE(findings.size() == 1);
  CHECK(findings[0] ==
        "call 1 of group 'world': the ranks disagree: rank 1 calls broadcast (float32, count 8, root 2); "
        "ranks 0, 2 call broadcast (float32, count 8, root 0)");
}

TEST_CASE("flight: the analysis names the algorithms where ranks chose different ones for one call", "[flight]") {
  // Rank 1's DTRAIN_ALGORITHMS differs: the first allreduce by ring everywhere, the second by
  // ring there and by recursive doubling elsewhere.
  std::vector<analysis::dump> dumps;
  for (int r = 0; r < 3; ++r) {
    auto first = record(r, 0, "allreduce", 8);
    first.algo = "ring";
    auto second = record(r, 1, "allreduce", 8, "failed");
    second.algo = r == 1 ? "ring" : "recursive_doubling";
    dumps.push_back(dump_of(r, {first, second}));
  }
  const auto findings = analysis::analyze(dumps, {3, {}});
  REQUIRE(findings.size() == 1);
  CHECK(findings[0] ==
        "call 1 of group 'world': the ranks disagree: rank 1 calls allreduce (float32 sum, count 8) by ring; "
        "ranks 0, 2 call allreduce (float32 sum, count 8) by recursive_doubling");
}

TEST_CASE("flight: the analysis does not take calls a ring dropped for a disagreement", "[flight]") {
  // Rank 1's ring kept only its last two calls; the others kept all four.
  std::vector<analysis::dump> dumps;
  for (int r = 0; r < 3; ++r) {
    std::vector<analysis::call_record> calls;
    for (std::uint64_t s = r == 1 ? 2 : 0; s < 4; ++s) calls.push_back(record(r, s, "allreduce", 8));
    dumps.push_back(dump_of(r, calls));
  }
  const auto findings = analysis::analyze(dumps, {3, {}});
  REQUIRE(findings.size() == 1);
  CHECK(findings[0] == "every rank recorded the same calls, and none is missing one");
}

TEST_CASE("flight: the analysis finds the rank behind in a sub-group, and what it does instead", "[flight]") {
  // Ranks 0 and 2 form group 'pair'; rank 2 is stuck in a world call waiting on rank 1, which
  // died; rank 0 waits in pair call 1 for rank 2.
  std::vector<analysis::dump> dumps;
  auto waiting = record(0, 1, "allgather", 4, "waiting", "pair");
  waiting.peer = 2;
  dumps.push_back(dump_of(0, {record(0, 0, "allreduce", 8), record(0, 0, "allgather", 4, "completed", "pair"), waiting},
                          "timeout"));
  dumps.push_back(dump_of(1, {record(1, 0, "allreduce", 8)}, "signal SIGSEGV"));
  auto stuck = record(2, 1, "allreduce", 8, "waiting");
  stuck.peer = 1;
  dumps.push_back(dump_of(2, {record(2, 0, "allreduce", 8), record(2, 0, "allgather", 4, "completed", "pair"), stuck},
                          "asked (SIGUSR2)"));
  const auto findings = analysis::analyze(dumps, {3, {}});
  REQUIRE(findings.size() == 3);
  CHECK(findings[0] == "rank 2 never reached call 1 of group 'pair', allgather (float32, count 4), which rank 0 "
                       "entered; its last there was call 0 (completed); it was in call 1 of group 'world', allreduce "
                       "(float32 sum, count 8), waiting on rank 1");
  // The rank that died first: the likeliest cause of the world's hang.
  CHECK(findings[1] == "rank 1 never reached call 1 of group 'world', allreduce (float32 sum, count 8), which rank 2 "
                       "entered; its last there was call 0 (completed); it died (signal SIGSEGV)");
  CHECK(findings[2] == "rank 0 never reached call 1 of group 'world', allreduce (float32 sum, count 8), which rank 2 "
                       "entered; its last there was call 0 (completed); it was in call 1 of group 'pair', allgather "
                       "(float32, count 4), waiting on rank 2");
}

TEST_CASE("flight: the analysis finds a group member that never recorded a call there by the wait on it",
          "[flight]") {
  // Rank 0 waits on rank 1 in the first call of 'pair'; rank 1 never entered 'pair'.
  std::vector<analysis::dump> dumps;
  auto waiting = record(0, 0, "allgather", 4, "waiting", "pair");
  waiting.peer = 1;
  dumps.push_back(dump_of(0, {record(0, 0, "allreduce", 8), waiting}, "asked (SIGUSR2)"));
  dumps.push_back(dump_of(1, {record(1, 0, "allreduce", 8)}, "asked (SIGUSR2)"));
  in_world_of(2, dumps);
  const auto findings = analysis::analyze(dumps, {2, {}});
  REQUIRE(findings.size() == 1);
  CHECK(findings[0].rfind("rank 1 never reached call 0 of group 'pair', allgather (float32, count 4), which rank 0 "
                          "entered; it was in none of its collectives when it dumped", 0) == 0);
}

TEST_CASE("flight: the analysis keeps apart two groups of one name and a communicator built again", "[flight]") {
  // Two groups named 'pair' (tags 1 and 2), each with its own count of calls, and a world
  // communicator built again after a failure whose calls start from 0 once more.
  std::vector<analysis::dump> dumps;
  for (int r = 0; r < 4; ++r) {
    auto pair_call = [&](std::uint64_t seq) {
      auto c = record(r, seq, "allreduce", 4, "completed", "pair");
      c.tag = r < 2 ? 1 : 2;
      return c;
    };
    std::vector<analysis::call_record> calls{record(r, 0, "allreduce", 8, "failed"), pair_call(0)};
    if (r < 2) calls.push_back(pair_call(1));  // ranks 0 and 1 have done one more
    auto again = record(r, 0, "broadcast", 16);
    again.generation = 1;
    calls.push_back(again);
    dumps.push_back(dump_of(r, calls));
  }
  const auto findings = analysis::analyze(dumps, {4, {}});
  REQUIRE(findings.size() == 1);
  CHECK(findings[0] == "every rank recorded the same calls, and none is missing one");
}

TEST_CASE("flight: the analysis names a receive its peer never sent, and what the peer did instead",
          "[flight][p2p]") {
  // Rank 1 waits for its third message from rank 0 on tag 7; rank 0 sent two and is stuck in a
  // world allreduce waiting on rank 1. Messages that must not count as rank 0's sends to rank 1
  // on tag 7 of 'world' reach k = 3 or more: rank 0's receives from rank 1 on that tag (the swap's
  // other way), its sends to rank 1 on tag 7 of another group, its sends to rank 2 on tag 7, and
  // rank 2's sends to rank 1 on tag 7. Rank 2's messages to rank 0, all matched and of other
  // counts, say nothing, and are no collective disagreement.
  std::vector<analysis::dump> dumps;
  auto allreduce = record(0, 1, "allreduce", 8, "waiting");
  allreduce.peer = 1;
  auto elsewhere = message(0, 1, true, 3, 7);
  elsewhere.group = "pair";
  auto bigger = message(0, 2, false, 1, 9);
  bigger.count = 1000;
  dumps.push_back(dump_of(0, {record(0, 0, "allreduce", 8), message(0, 1, true, 1, 7), message(0, 1, true, 2, 7),
                              message(0, 1, false, 4, 7), elsewhere, message(0, 2, true, 5, 7), bigger, allreduce},
                          "asked (SIGUSR2)"));
  dumps.push_back(dump_of(1, {record(1, 0, "allreduce", 8), message(1, 0, false, 1, 7), message(1, 0, false, 2, 7),
                              message(1, 0, false, 3, 7, "waiting"), message(1, 2, false, 3, 7)},
                          "asked (SIGUSR2)"));
  dumps.push_back(dump_of(2, {record(2, 0, "allreduce", 8), message(2, 0, true, 1, 9), message(2, 1, true, 3, 7),
                              message(2, 0, false, 5, 7), record(2, 1, "allreduce", 8)},
                          "asked (SIGUSR2)"));
  dumps[0].calls[7].start_us = 2000;  // the allreduce: the last call rank 0 entered
  const auto findings = analysis::analyze(dumps, {3, {}});
  REQUIRE(findings.size() == 2);
  CHECK(findings[0] == "rank 1 never reached call 1 of group 'world', allreduce (float32 sum, count 8), which ranks 0, "
                       "2 entered; its last there was call 0 (completed); it was in receive 3 from rank 0 (tag 7 of "
                       "group 'world', 16 float32), waiting");
  CHECK(findings[1] == "rank 1 waits in receive 3 from rank 0 (tag 7 of group 'world', 16 float32); rank 0 posted "
                       "only 2 sends there; it was in call 1 of group 'world', allreduce (float32 sum, count 8), "
                       "waiting on rank 1");
}

TEST_CASE("flight: the analysis says so when the peer of a message waited for in vain left no record",
          "[flight][p2p]") {
  std::vector<analysis::dump> dumps;
  dumps.push_back(dump_of(0, {message(0, 1, false, 1, 5, "waiting")}, "timeout"));
  in_world_of(2, dumps);
  const auto findings = analysis::analyze(dumps, {2, {{1, "was killed by signal 9 (SIGKILL)"}}});
  REQUIRE(findings.size() >= 1);
  CHECK(findings[0] == "rank 0 waits in receive 1 from rank 1 (tag 5 of group 'world', 16 float32); rank 1 posted no "
                       "sends there; it left no flight record (it was killed by signal 9 (SIGKILL))");
}

TEST_CASE("flight: the analysis names a send no receive met, and a message posted ahead is no place to be stuck",
          "[flight][p2p]") {
  // Rank 0 waits in a send to rank 1 that rank 1 never received: rank 1 is in user code with a
  // receive from rank 0 on another tag posted ahead and not waited for.
  std::vector<analysis::dump> dumps;
  dumps.push_back(dump_of(0, {message(0, 1, true, 1, 5, "waiting")}, "asked (SIGUSR2)"));
  dumps.push_back(dump_of(1, {message(1, 0, false, 1, 6, "started")}, "asked (SIGUSR2)"));
  in_world_of(2, dumps);
  const auto findings = analysis::analyze(dumps, {2, {}});
  REQUIRE(findings.size() == 1);
  CHECK(findings[0] == "rank 0 waits in send 1 to rank 1 (tag 5 of group 'world', 16 float32); rank 1 posted no "
                       "receives there; it was in none of its collectives when it dumped");
}

TEST_CASE("flight: the analysis names a message that failed on its own, not one its group's failure took",
          "[flight][p2p]") {
  // Rank 0's receive found rank 1's send of another type; rank 2's receives failed with the
  // group: one when a rank was lost, two when the finder aborted the group, which the others
  // raise with its code (the bare words, or quoting the abort).
  std::vector<analysis::dump> dumps;
  auto mismatched = message(0, 1, false, 1, 9, "failed");
  mismatched.note = "staged receive from rank 1 (tag 9) at rank 0: expected 16 float32, the sender sent 16 float64: "
                    "collective mismatch between ranks";
  auto lost = message(2, 1, false, 1, 4, "failed");
  lost.note = "rank 1 has left the group: peer lost";
  auto told = message(2, 1, false, 2, 4, "failed");
  told.note = "collective mismatch between ranks";
  auto quoted = message(2, 1, false, 3, 4, "failed");
  quoted.note = "recv from rank 1 (tag 4) at rank 2: rank 0 aborted the group: rank 0 reports: ...: collective "
                "mismatch between ranks";
  dumps.push_back(dump_of(0, {mismatched}, "exit"));
  dumps.push_back(dump_of(1, {message(1, 0, true, 1, 9), message(1, 2, true, 1, 4), message(1, 2, true, 2, 4),
                              message(1, 2, true, 3, 4)},
                          "exit"));
  dumps.push_back(dump_of(2, {lost, told, quoted}, "exit"));
  in_world_of(3, dumps);
  const auto findings = analysis::analyze(dumps, {3, {}});
  REQUIRE(findings.size() == 1);
  CHECK(findings[0] ==
        "rank 0's receive 1 from rank 1 (tag 9 of group 'world', 16 float32) failed: " + mismatched.note);
}

TEST_CASE("flight: the analysis does not count a withdrawn message as posted", "[flight][p2p]") {
  // Rank 0 waits in receive 2 from rank 1; rank 1 sent one message and withdrew a second before
  // it matched. Then the same with rank 1's next send, renumbered 2, posted after the withdrawal:
  // it meets the receive, and nothing is wrong.
  std::vector<analysis::dump> dumps;
  dumps.push_back(dump_of(0, {message(0, 1, false, 1, 5), message(0, 1, false, 2, 5, "waiting")}, "asked (SIGUSR2)"));
  dumps.push_back(dump_of(1, {message(1, 0, true, 1, 5), message(1, 0, true, 2, 5, "withdrawn")}, "asked (SIGUSR2)"));
  in_world_of(2, dumps);
  auto findings = analysis::analyze(dumps, {2, {}});
  REQUIRE(findings.size() == 1);
  CHECK(findings[0] == "rank 0 waits in receive 2 from rank 1 (tag 5 of group 'world', 16 float32); rank 1 posted "
                       "only 1 send there; it was in none of its collectives when it dumped, 0.0 s after its last "
                       "one ended (user code)");
  dumps[1].calls.push_back(message(1, 0, true, 2, 5, "started"));
  findings = analysis::analyze(dumps, {2, {}});
  REQUIRE(findings.size() == 1);
  CHECK(findings[0] == "every rank recorded the same calls, and none is missing one");
}
