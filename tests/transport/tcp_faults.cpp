// Faults across real processes: each test starts tcp_worker processes itself (with a store it
// serves, as dtrain-run does), injects the fault, and checks every survivor's exit status and
// words, and how long it took.

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "../catch.hpp"
#include "dtrain/rendezvous/tcp_store.hpp"

extern char** environ;

using namespace dtrain;
using namespace std::chrono_literals;

namespace {

struct outcome {
  int status = -1;  // exit status, or 128 + signal
  std::string output;
};

struct group_run {
  std::vector<outcome> ranks;
  std::chrono::milliseconds elapsed{0};
};

const std::string job_token = "fault-test-token";

// Starts `n` tcp_worker processes in `mode`; `extra(rank)` adds environment variables; `during`
// runs while they do. Every process is killed if the group is not done within `limit`.
template <class Extra, class During>
group_run run_group(int n, const std::string& mode, Extra extra, During during,
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
    std::string prog = DTRAIN_TCP_WORKER;
    char* argv[] = {prog.data(), const_cast<char*>(mode.c_str()), nullptr};
    pid_t pid = -1;
    REQUIRE(posix_spawn(&pid, prog.c_str(), &fa, nullptr, argv, envp.data()) == 0);
    posix_spawn_file_actions_destroy(&fa);
    pids.push_back(pid);
  }
  during(store);
  group_run out;
  out.ranks.resize(static_cast<std::size_t>(n));
  std::vector<bool> done(static_cast<std::size_t>(n), false);
  for (int left = n; left > 0;) {
    for (int r = 0; r < n; ++r) {
      if (done[static_cast<std::size_t>(r)]) continue;
      int st = 0;
      if (::waitpid(pids[static_cast<std::size_t>(r)], &st, WNOHANG) == pids[static_cast<std::size_t>(r)]) {
        done[static_cast<std::size_t>(r)] = true;
        out.ranks[static_cast<std::size_t>(r)].status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        --left;
      }
    }
    if (std::chrono::steady_clock::now() - t0 > limit) {
      for (int r = 0; r < n; ++r) {
        if (!done[static_cast<std::size_t>(r)]) ::kill(pids[static_cast<std::size_t>(r)], SIGKILL);
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
  return out;
}

auto no_extra = [](int) { return std::vector<std::string>{}; };
auto nothing_during = [](tcp_store_server&) {};

std::string dump(const group_run& g) {
  std::string s = "elapsed " + std::to_string(g.elapsed.count()) + " ms\n";
  for (std::size_t r = 0; r < g.ranks.size(); ++r) {
    s += "--- rank " + std::to_string(r) + " status " + std::to_string(g.ranks[r].status) + "\n" + g.ranks[r].output;
  }
  return s;
}

bool has(const std::string& text, const std::string& word) { return text.find(word) != std::string::npos; }

}  // namespace

TEST_CASE("faults: a rank SIGKILLed mid-allreduce makes every survivor fail fast, naming it", "[tcp][faults]") {
  auto g = run_group(4, "allreduce-loop", [](int) {
    return std::vector<std::string>{"DTRAIN_TEST_KILL_RANK=2", "DTRAIN_TEST_LOOP_MS=20000"};
  }, nothing_during);
  INFO(dump(g));
  CHECK(g.ranks[2].status == 128 + SIGKILL);
  for (int r : {0, 1, 3}) {
    const auto& o = g.ranks[static_cast<std::size_t>(r)];
    CHECK(o.status == 3);  // caught the documented error
    CHECK(has(o.output, "[peer lost]"));
    CHECK(has(o.output, "rank 2"));
    // The collective it was in: the allreduce, or the loop's broadcast if it was behind.
    CHECK((has(o.output, "allreduce #") || has(o.output, "broadcast #")));
  }
  CHECK(g.elapsed < 20s);  // far inside the 30 s deadline: nobody waited it out
}

TEST_CASE("faults: a rank with the wrong token is refused and logged; nobody hangs", "[tcp][faults]") {
  auto g = run_group(2, "allreduce-loop", [](int r) {
    return r == 1 ? std::vector<std::string>{"DTRAIN_TOKEN=wrong", "DTRAIN_TIMEOUT_MS=3000"}
                  : std::vector<std::string>{"DTRAIN_TIMEOUT_MS=3000"};
  }, nothing_during);
  INFO(dump(g));
  // Rank 1 cannot even reach the store with its token; rank 0 times out naming rank 1.
  CHECK(g.ranks[1].status == 3);
  CHECK(has(g.ranks[1].output, "token"));
  CHECK(g.ranks[0].status == 3);
  CHECK(has(g.ranks[0].output, "[deadline exceeded]"));
  CHECK(g.elapsed < 15s);
}

TEST_CASE("faults: junk on every listening port is refused; the job goes on correctly", "[tcp][faults]") {
  std::vector<std::string> refusals;
  auto g = run_group(3, "allreduce-loop", [](int) {
    return std::vector<std::string>{"DTRAIN_TEST_DELAY_MS=1500", "DTRAIN_TEST_LOOP_MS=1000"};
  }, [&](tcp_store_server& store) {
    // Rank 0 joins at once and listens; the others come 1.5 s later. Meanwhile: junk to rank 0's
    // transport port and to the store, random and oversized, from unauthenticated clients.
    tcp_store client("127.0.0.1", store.port(), deadline::after(10s), job_token);
    auto where = value_text(client.get(epoch_key(0, "addr/0"), deadline::after(10s)));
    auto colon = where.rfind(':');
    std::vector<std::uint16_t> ports{static_cast<std::uint16_t>(std::stoi(where.substr(colon + 1))), store.port()};
    std::mt19937 rng(1);
    boost::asio::io_context io;
    for (auto port : ports) {
      for (int attempt = 0; attempt < 4; ++attempt) {
        detail::tcp::socket s(io);
        s.connect({boost::asio::ip::make_address("127.0.0.1"), port});
        std::vector<std::byte> junk(attempt == 3 ? 1 << 20 : 100 + attempt * 1000);
        for (auto& b : junk) b = static_cast<std::byte>(rng());
        if (attempt == 2) {  // a well-formed data frame announcing 64 GiB, without any handshake
          frame_header h;
          h.length = std::uint64_t{64} << 30;
          auto f = encode_frame(h);
          std::copy(f.begin(), f.end(), junk.begin());
        }
        boost::system::error_code ignored;
        boost::asio::write(s, boost::asio::buffer(junk), ignored);
        s.close(ignored);
      }
    }
  });
  INFO(dump(g));
  for (const auto& o : g.ranks) {
    CHECK(o.status == 0);
    CHECK(has(o.output, "all correct"));
  }
  CHECK(has(g.ranks[0].output, "refused a connection from 127.0.0.1"));
}

TEST_CASE("faults: mismatched collectives across processes name both sides", "[tcp][faults]") {
  auto g = run_group(2, "mismatch", no_extra, nothing_during);
  INFO(dump(g));
  bool named = false;
  for (const auto& o : g.ranks) {
    CHECK(o.status == 3);
    named = named || (has(o.output, "collective mismatch") && has(o.output, "allreduce #0") && has(o.output, "broadcast #0"));
  }
  CHECK(named);
  CHECK(g.elapsed < 20s);
}
