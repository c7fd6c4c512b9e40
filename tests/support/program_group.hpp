#pragma once
// Starts a group of test processes the way dtrain-run does (a store served here, a token, rank
// and size in the environment), but lets each exit on its own, so fault tests can kill one and
// watch what the others say. Output of each rank is captured.

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "../catch.hpp"
#include "text.hpp"  // has
#include "dtrain/rendezvous/tcp_store.hpp"

extern char** environ;

namespace dtrain::testing {

using namespace std::chrono_literals;

// The status of a rank the harness killed because the group outlived its limit: a hang, never to
// be read as the 128 + SIGKILL of a kill the test made.
inline constexpr int hung = -2;

struct outcome {
  int status = -1;  // exit status, or 128 + signal, or `hung`
  std::string output;
};

struct group_run {
  std::vector<outcome> ranks;
  std::chrono::milliseconds elapsed{0};
  bool hung = false;  // some rank was still running at the limit
};

inline const std::string job_token = "fault-test-token";

// Starts `n` tcp_worker processes in `mode`; `extra(rank)` adds environment variables; `during`
// runs while they do, given the store and, if it asks for them, the processes' pids. Every
// process still running at `limit` is killed and reported `hung`, which fails the test: no test
// expects a hang, the limit is only a safety net.
template <class Extra, class During>
group_run run_program_group(const std::string& program, int n, const std::string& mode, Extra extra, During during,
                            std::chrono::seconds limit = 60s) {
  tcp_store_server store("127.0.0.1", 0, job_token);
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < n; ++r) {
    // getenv finds the first definition: the test's own settings, then the defaults, then ours.
    std::vector<std::string> env = extra(r);
    env.push_back("DTRAIN_RANK=" + std::to_string(r));
    env.push_back("DTRAIN_WORLD_SIZE=" + std::to_string(n));
    env.push_back("DTRAIN_STORE=127.0.0.1:" + std::to_string(store.port()));
    env.push_back("DTRAIN_TOKEN=" + job_token);
    env.push_back("DTRAIN_TIMEOUT_MS=30000");
    for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
    std::vector<char*> envp;
    for (auto& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string log = "/tmp/dtrain-fault-" + std::to_string(::getpid()) + "-" + std::to_string(r) + ".log";
    logs.push_back(log);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
    std::string prog = program;
    char* argv[] = {prog.data(), const_cast<char*>(mode.c_str()), nullptr};
    pid_t pid = -1;
    REQUIRE(posix_spawn(&pid, prog.c_str(), &fa, nullptr, argv, envp.data()) == 0);
    posix_spawn_file_actions_destroy(&fa);
    pids.push_back(pid);
  }
  if constexpr (std::is_invocable_v<During&, tcp_store_server&, const std::vector<pid_t>&>) {
    during(store, pids);
  } else {
    during(store);
  }
  group_run out;
  out.ranks.resize(static_cast<std::size_t>(n));
  std::vector<bool> done(static_cast<std::size_t>(n), false);
  for (int left = n; left > 0;) {
    for (int r = 0; r < n; ++r) {
      if (done[static_cast<std::size_t>(r)]) continue;
      int st = 0;
      if (::waitpid(pids[static_cast<std::size_t>(r)], &st, WNOHANG) == pids[static_cast<std::size_t>(r)]) {
        done[static_cast<std::size_t>(r)] = true;
        auto& status = out.ranks[static_cast<std::size_t>(r)].status;
        if (status != hung) status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        --left;
      }
    }
    if (!out.hung && std::chrono::steady_clock::now() - t0 > limit) {
      out.hung = true;
      for (int r = 0; r < n; ++r) {
        if (done[static_cast<std::size_t>(r)]) continue;
        out.ranks[static_cast<std::size_t>(r)].status = hung;
        ::kill(pids[static_cast<std::size_t>(r)], SIGKILL);
      }
    }
    std::this_thread::sleep_for(5ms);
  }
  out.elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  for (int r = 0; r < n; ++r) {
    std::ifstream in(logs[static_cast<std::size_t>(r)]);
    std::stringstream ss;
    ss << in.rdbuf();
    out.ranks[static_cast<std::size_t>(r)].output = ss.str();
    std::remove(logs[static_cast<std::size_t>(r)].c_str());
  }
  if (out.hung) {
    std::string hung_ranks;
    for (int r = 0; r < n; ++r) {
      if (out.ranks[static_cast<std::size_t>(r)].status == hung) hung_ranks += " " + std::to_string(r);
    }
    FAIL_CHECK("the group outlived its " << limit.count() << " s limit: the harness killed rank(s)" << hung_ranks);
  }
  return out;
}

inline auto no_extra = [](int) { return std::vector<std::string>{}; };
inline auto nothing_during = [](tcp_store_server&) {};

inline std::string dump(const group_run& g) {
  std::string s = "elapsed " + std::to_string(g.elapsed.count()) + " ms\n";
  for (std::size_t r = 0; r < g.ranks.size(); ++r) {
    const std::string status = g.ranks[r].status == hung ? "HUNG (killed by the harness at its limit)"
                                                         : std::to_string(g.ranks[r].status);
    s += "--- rank " + std::to_string(r) + " status " + status + "\n" + g.ranks[r].output;
  }
  return s;
}

// The number a rank printed right after `marker` in `text` (the TCP workers print CLOCK_MONOTONIC
// times in microseconds); none if it did not print the marker.
inline std::optional<long long> number_after(const std::string& text, const std::string& marker) {
  const auto at = text.find(marker);
  if (at == std::string::npos) return std::nullopt;
  return std::atoll(text.c_str() + at + marker.size());
}

// tcp_worker's "mismatch" on 2 ranks (rank 0 allreduces, rank 1 broadcasts from 0): rank 1
// receives rank 0's allreduce message in its broadcast and names both calls; rank 0 hears no
// message of rank 1's (a broadcast's non-root sends nothing), so it learns of the mismatch from
// rank 1's abort (`engine_handle::abort`): every rank raises `collective_mismatch` naming both
// calls, at once.
inline void check_mismatch_verdicts(const group_run& g) {
  for (const auto& o : g.ranks) {
    CHECK(o.status == 3);
    CHECK(has(o.output, "[collective mismatch between ranks]"));  // the error's code, on every rank
    CHECK(has(o.output, "allreduce #0"));
    CHECK(has(o.output, "broadcast #0"));
    CHECK(!has(o.output, "deadline"));  // told at once, not by its deadline
  }
  CHECK(has(g.ranks[0].output, "rank 1 aborted the group"));
  CHECK(g.elapsed < 20s);
}

}  // namespace dtrain::testing
