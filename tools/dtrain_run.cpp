// dtrain-run: starts N local processes of one dtrain job.
//
//   dtrain-run -n 4 [--servers S] [--standby B] [--shards J] [--growing G] [--late-workers L]
//              [--join-after-ms T] [--keep-going] [--time-limit S] [--flight-dir D] prog args...
//   dtrain-run --analyze D [-n 4]      what the flight-recorder dumps in D say
//
// It serves the job's rendezvous store, generates a job token (unless DTRAIN_TOKEN or
// DTRAIN_TOKEN_FILE is set), gives each child DTRAIN_RANK, DTRAIN_WORLD_SIZE,
// DTRAIN_LOCAL_RANK, DTRAIN_LOCAL_WORLD_SIZE, DTRAIN_STORE and DTRAIN_TOKEN, prefixes every
// output line with the child's rank, and when a child fails stops the others (unless
// --keep-going) and exits non-zero naming the rank that failed first.
//
// Every rank dumps its flight recorder into the job's flight directory (DTRAIN_FLIGHT_DIR) when
// a collective of it fails, on a fatal signal, at exit and when asked (SIGUSR2). When a rank fails
// or the job runs past --time-limit, dtrain-run asks the others for their dumps before it stops
// them, and prints what the dumps say (tools/flight_analysis.hpp).

#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/flight/dump.hpp"
#include "dtrain/rendezvous/tcp_store.hpp"
#include "flight_analysis.hpp"

extern char** environ;

namespace {

struct child {
  int rank = 0;
  pid_t pid = -1;
  int out = -1;  // read ends of its stdout and stderr pipes
  int err = -1;
  std::string pending_out, pending_err;
  bool running = false;
  int status = 0;
  std::chrono::steady_clock::time_point start_at;  // a late worker starts later than the others
};

// Starts `c` running `command` with environment `env`, its output into pipes. @returns 0, or
// the error posix_spawnp or pipe2 gave.
int spawn(child& c, std::vector<std::string> command, std::vector<std::string> env) {
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return errno;
  if (::pipe2(err, O_CLOEXEC) != 0) {
    const int e = errno;
    ::close(out[0]);
    ::close(out[1]);
    return e;
  }
  std::vector<char*> envp, args;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  for (auto& s : command) args.push_back(s.data());
  args.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&fa, err[1], STDERR_FILENO);
  const int rc = posix_spawnp(&c.pid, args[0], &fa, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  ::close(out[1]);
  ::close(err[1]);
  if (rc != 0) {
    ::close(out[0]);
    ::close(err[0]);
    return rc;
  }
  c.out = out[0];
  c.err = err[0];
  c.running = true;
  return 0;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    const char* name = sigabbrev_np(sig);
    return fmt::format("was killed by signal {} (SIG{})", sig, name != nullptr ? name : "?");
  }
  return "ended abnormally";
}

bool failed(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

// Prints what the dumps in `dir` say. @returns whether there was any dump to read.
bool report_flight(const std::filesystem::path& dir, const dtrain_tools::flight::launch_facts& facts) {
  std::vector<std::string> problems;
  const auto dumps = dtrain_tools::flight::read_directory(dir, problems);
  for (const auto& p : problems) std::fprintf(stderr, "dtrain-run: flight recorder: %s\n", p.c_str());
  if (dumps.empty()) {
    std::fprintf(stderr, "dtrain-run: flight recorder: no dump in %s\n", dir.c_str());
    return false;
  }
  std::fprintf(stderr, "dtrain-run: flight recorder (%zu dumps in %s):\n", dumps.size(), dir.c_str());
  for (const auto& f : dtrain_tools::flight::analyze(dumps, facts)) {
    std::fprintf(stderr, "dtrain-run:   %s\n", f.c_str());
  }
  return true;
}

// When `c` last dumped (its file's `dumped_us` line), or 0 if it has not (a file of another
// process, a job's before in a reused directory, does not count).
std::int64_t dumped_us(const std::filesystem::path& dir, const child& c) {
  dtrain_tools::flight::dump d;
  std::string ignored;
  const bool mine = dtrain_tools::flight::read_dump(dir / fmt::format("flight.{}.txt", c.rank), d, ignored) &&
                    d.pid == static_cast<long>(c.pid);
  return mine ? d.dumped_us : 0;
}

// Whether `c` has ended (left for the main loop to reap).
bool ended(const child& c) {
  siginfo_t info{};
  return ::waitid(P_PID, static_cast<id_t>(c.pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == c.pid;
}

// Sends the dump signal to every running child that has dumped before (a dtrain process, which
// handles it; to others it is fatal) and waits, at most `patience`, until each has dumped again
// or ended.
void request_dumps(const std::vector<child>& children, const std::filesystem::path& dir,
                   std::chrono::milliseconds patience) {
  const std::int64_t asked = dtrain::flight::recorder::now_us();
  std::vector<const child*> asking;
  for (const auto& c : children) {
    if (c.running && dumped_us(dir, c) > 0) {
      ::kill(c.pid, dtrain::flight::dump_signal);
      asking.push_back(&c);
    }
  }
  const auto until = std::chrono::steady_clock::now() + patience;
  for (bool all = asking.empty(); !all && std::chrono::steady_clock::now() < until;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    all = true;
    for (const child* c : asking) {
      all = all && (ended(*c) || dumped_us(dir, *c) >= asked);
    }
  }
}

// Moves complete lines from `fd` to `sink`, each prefixed with the rank; false at end of file.
bool pump(int fd, std::string& pending, int rank, FILE* sink) {
  char buf[65536];
  ssize_t n = ::read(fd, buf, sizeof buf);
  if (n <= 0) {
    if (!pending.empty()) std::fprintf(sink, "[%d] %s\n", rank, pending.c_str());
    pending.clear();
    return false;
  }
  pending.append(buf, static_cast<std::size_t>(n));
  std::size_t start = 0;
  for (std::size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
    std::fprintf(sink, "[%d] %.*s\n", rank, static_cast<int>(nl - start), pending.data() + start);
  }
  pending.erase(0, start);
  std::fflush(sink);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dtrain-run: start N local processes of one dtrain job"};
  int n = 0;
  int grace_ms = 5000;
  app.add_option("-n,--nproc", n, "number of processes (ranks)")->check(CLI::Range(1, 4096));
  double time_limit_s = 0;
  app.add_option("--time-limit", time_limit_s,
                 "seconds the job may run; past them every rank is asked for its flight record, then stopped "
                 "(exit status 124)")
      ->check(CLI::NonNegativeNumber);
  std::string flight_dir;
  app.add_option("--flight-dir", flight_dir,
                 "where the ranks dump their flight recorders (DTRAIN_FLIGHT_DIR), kept after the job; default: "
                 "a new directory under $TMPDIR, removed when the job succeeds");
  std::string analyze_dir;
  app.add_option("--analyze", analyze_dir, "only print what the flight-recorder dumps in this directory say");
  app.add_option("--grace-ms", grace_ms, "after a failure, how long the others get to exit after SIGTERM");
  bool keep_going = false;
  app.add_flag("--keep-going", keep_going,
               "a rank that fails does not stop the others (a parameter server with replicated shards outlives a "
               "lost server); the exit status is still the first failure's");
  int servers = 0;
  app.add_option("--servers", servers, "parameter-server jobs: the first N ranks serve (sets DTRAIN_PS_SERVERS)")
      ->check(CLI::Range(0, 4095));
  int standby = 0;
  app.add_option("--standby", standby,
                 "parameter-server jobs: the last N ranks are standby servers, which take lost servers' places "
                 "(sets DTRAIN_PS_STANDBY)")
      ->check(CLI::Range(0, 4095));
  int shards = 0, growing = 0;
  app.add_option("--shards", shards,
                 "parameter-server jobs: cut the keys into N shards, N >= servers (sets DTRAIN_PS_SHARDS)")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option(
         "--growing", growing,
         "parameter-server jobs: the first N standby servers add capacity, taking their share of the shards when "
         "they come; their processes start --join-after-ms later (sets DTRAIN_PS_GROWING)")
      ->check(CLI::Range(0, 4095));
  int late_workers = 0, join_after_ms = 0;
  app.add_option("--late-workers", late_workers,
                 "parameter-server jobs: the last N workers join the running job (sets DTRAIN_PS_LATE_WORKERS, and "
                 "DTRAIN_LATE_RANKS to them and the standby servers)")
      ->check(CLI::Range(0, 4095));
  app.add_option("--join-after-ms", join_after_ms,
                 "with --late-workers or --growing: start their processes this long after the others")
      ->check(CLI::Range(0, 86400000));
  // Parsing stops at the first argument that is not one of the options above: the program,
  // then its arguments, whatever they look like (a positional would let CLI11 go on taking
  // options it knows, such as -n, from the program's arguments).
  app.prefix_command();
  app.footer("After the options: the program and its arguments (or -- first).");
  CLI11_PARSE(app, argc, argv);
  std::vector<std::string> command = app.remaining();
  if (!command.empty() && command.front() == "--") command.erase(command.begin());
  if (!command.empty() && command.front().size() > 1 && command.front()[0] == '-') {
    std::fprintf(stderr,
                 "dtrain-run: unknown option before the program: %s (the program's own options go after its "
                 "path; see --help)\n",
                 command.front().c_str());
    return 2;
  }
  if (!analyze_dir.empty()) return report_flight(analyze_dir, {n, {}}) ? 0 : 1;
  if (n == 0 || command.empty()) {
    std::fprintf(stderr, "dtrain-run: -n and a program are required (or --analyze DIR); see --help\n");
    return 2;
  }
  const bool own_flight_dir = flight_dir.empty();
  if (own_flight_dir) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/dtrain-flight-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      std::fprintf(stderr, "dtrain-run: cannot make a flight-recorder directory %s: %s\n", pattern.c_str(),
                   std::strerror(errno));
      return 2;
    }
    flight_dir = pattern;
  } else if (std::error_code ec; !std::filesystem::create_directories(flight_dir, ec) && ec) {
    std::fprintf(stderr, "dtrain-run: cannot make the flight directory %s: %s\n", flight_dir.c_str(),
                 ec.message().c_str());
    return 2;
  } else {  // a directory used before: its dumps are another job's
    for (const auto& entry : std::filesystem::directory_iterator(flight_dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("flight.", 0) == 0 && entry.path().extension() == ".txt") std::filesystem::remove(entry, ec);
    }
  }

  std::string token = dtrain::detail::auth::load_token(std::nullopt);  // the user's, if set
  if (token.empty()) token = dtrain::detail::auth::generate_token();
  dtrain::tcp_store_server store("127.0.0.1", 0, token);

  std::vector<std::string> env_text;
  for (char** e = environ; *e != nullptr; ++e) env_text.emplace_back(*e);
  if (late_workers > 0 && servers + standby + late_workers >= n) {
    std::fprintf(stderr, "dtrain-run: %d servers, %d standby and %d late workers leave no worker to start the job\n",
                 servers, standby, late_workers);
    return 2;
  }
  const int first_late = n - standby - late_workers;  // late workers: [first_late, n - standby)
  const int first_standby = n - standby;              // growing servers: [first_standby, first_standby + growing)
  const auto began = std::chrono::steady_clock::now();
  std::vector<child> children(static_cast<std::size_t>(n));
  std::vector<std::vector<std::string>> envs(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    child& c = children[static_cast<std::size_t>(r)];
    c.rank = r;
    const bool late = (late_workers > 0 && r >= first_late && r < first_standby) ||
                      (r >= first_standby && r < first_standby + growing);
    c.start_at = began + std::chrono::milliseconds(late ? join_after_ms : 0);
    std::vector<std::string>& env = envs[static_cast<std::size_t>(r)];
    env = env_text;
    env.push_back(fmt::format("DTRAIN_RANK={}", r));
    env.push_back(fmt::format("DTRAIN_WORLD_SIZE={}", n));
    env.push_back(fmt::format("DTRAIN_LOCAL_RANK={}", r));
    env.push_back(fmt::format("DTRAIN_LOCAL_WORLD_SIZE={}", n));
    env.push_back(fmt::format("DTRAIN_STORE=127.0.0.1:{}", store.port()));
    env.push_back("DTRAIN_TOKEN=" + token);
    env.push_back("DTRAIN_FLIGHT_DIR=" + flight_dir);
    if (servers > 0) env.push_back(fmt::format("DTRAIN_PS_SERVERS={}", servers));
    if (standby > 0) env.push_back(fmt::format("DTRAIN_PS_STANDBY={}", standby));
    if (shards > 0) env.push_back(fmt::format("DTRAIN_PS_SHARDS={}", shards));
    if (growing > 0) env.push_back(fmt::format("DTRAIN_PS_GROWING={}", growing));
    if (late_workers > 0) env.push_back(fmt::format("DTRAIN_PS_LATE_WORKERS={}", late_workers));
    if (late_workers > 0 || growing > 0) env.push_back(fmt::format("DTRAIN_LATE_RANKS={}", late_workers + standby));
  }
  // Starts every child whose time has come; false (the others killed) if one cannot start.
  auto start_due = [&] {
    for (auto& c : children) {
      if (c.pid >= 0 || std::chrono::steady_clock::now() < c.start_at) continue;  // started, given up, or not yet
      if (const int rc = spawn(c, command, envs[static_cast<std::size_t>(c.rank)]); rc != 0) {
        std::fprintf(stderr, "dtrain-run: cannot start %s (rank %d): %s\n", command[0].c_str(), c.rank,
                     std::strerror(rc));
        for (auto& o : children) if (o.pid > 0 && o.running) ::kill(o.pid, SIGKILL);
        return false;
      }
    }
    return true;
  };
  if (!start_due()) return 127;

  std::optional<int> first_failure;
  int first_status = 0;
  bool sent_term = false, sent_kill = false;  // whether a rank's SIGTERM or SIGKILL can be ours
  auto stop_others = [&] {
    sent_term = true;
    for (auto& c : children) {
      if (c.running) ::kill(c.pid, SIGTERM);
    }
  };
  auto killed_at = std::chrono::steady_clock::time_point::max();
  const auto dumps_patience = std::chrono::milliseconds(2000);
  bool over_time = false;
  int running = n;  // counting those not started yet
  while (running > 0) {
    const bool stopping = first_failure && !keep_going;
    if (!stopping && !start_due()) return 127;
    std::vector<pollfd> fds;
    std::vector<std::pair<child*, bool>> owners;
    for (auto& c : children) {
      if (c.out >= 0) { fds.push_back({c.out, POLLIN, 0}); owners.push_back({&c, true}); }
      if (c.err >= 0) { fds.push_back({c.err, POLLIN, 0}); owners.push_back({&c, false}); }
    }
    if (!fds.empty()) ::poll(fds.data(), fds.size(), 50);
    else std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (std::size_t i = 0; i < fds.size(); ++i) {
      if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      auto [c, is_out] = owners[i];
      int& fd = is_out ? c->out : c->err;
      if (!pump(fd, is_out ? c->pending_out : c->pending_err, c->rank, is_out ? stdout : stderr)) {
        ::close(fd);
        fd = -1;
      }
    }
    for (auto& c : children) {
      if (!c.running) {
        if (c.pid < 0 && stopping) {  // a late worker not started yet: the job failed before it came
          c.pid = 0;
          --running;
        }
        continue;
      }
      int status = 0;
      if (::waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
      c.running = false;
      c.status = status;
      --running;
      if (failed(status) && !first_failure && !over_time) {  // past the limit: stopped by us
        first_failure = c.rank;
        first_status = status;
        std::fprintf(stderr, "dtrain-run: rank %d %s; %s\n", c.rank, describe_status(status).c_str(),
                     keep_going ? "the others go on (--keep-going)" : "stopping the other ranks");
        if (!keep_going) {
          request_dumps(children, flight_dir, dumps_patience);
          stop_others();
          killed_at = std::chrono::steady_clock::now() + std::chrono::milliseconds(grace_ms);
        }
      } else if (failed(status) && WIFSIGNALED(status) && !(WTERMSIG(status) == SIGTERM && sent_term) &&
                 !(WTERMSIG(status) == SIGKILL && sent_kill)) {
        // A crash after the first failure: a rank closes its sockets a moment before it can be
        // reaped, so the peer that lost it may have ended first. Said, not guessed at; the flight
        // report tells which rank stopped first.
        std::fprintf(stderr, "dtrain-run: rank %d %s as well\n", c.rank, describe_status(status).c_str());
      }
    }
    if (time_limit_s > 0 && !over_time &&
        std::chrono::steady_clock::now() - began > std::chrono::duration<double>(time_limit_s)) {
      over_time = true;
      std::fprintf(stderr, "dtrain-run: the job ran past its time limit of %g s; asking every rank for its flight "
                   "record, then stopping them\n", time_limit_s);
      request_dumps(children, flight_dir, dumps_patience);
      stop_others();
      killed_at = std::min(killed_at, std::chrono::steady_clock::now() + std::chrono::milliseconds(grace_ms));
    }
    if (std::chrono::steady_clock::now() > killed_at) {
      for (auto& c : children) if (c.running) ::kill(c.pid, SIGKILL);
      sent_kill = true;
      killed_at = std::chrono::steady_clock::time_point::max();
    }
  }
  for (auto& c : children) {  // what is left in the pipes
    while (c.out >= 0 && pump(c.out, c.pending_out, c.rank, stdout)) {}
    while (c.err >= 0 && pump(c.err, c.pending_err, c.rank, stderr)) {}
  }
  if (first_failure || over_time) {
    dtrain_tools::flight::launch_facts facts{n, {}};
    for (const auto& c : children) {
      if (c.pid > 0) facts.ends[c.rank] = describe_status(c.status);
    }
    // A directory of its own that no rank dumped into (a rank refused its input and exited) has
    // nothing to read: it goes, as after a clean exit; one with dumps stays for the user.
    if (!report_flight(flight_dir, facts) && own_flight_dir) {
      std::error_code ignored;
      std::filesystem::remove(flight_dir, ignored);  // only while empty
    }
  } else if (own_flight_dir) {
    std::error_code ignored;
    std::filesystem::remove_all(flight_dir, ignored);
  }
  if (over_time) {
    std::fprintf(stderr, "dtrain-run: failed: the job ran past its time limit of %g s\n", time_limit_s);
    return 124;
  }
  if (first_failure) {
    std::fprintf(stderr, "dtrain-run: failed: rank %d %s\n", *first_failure, describe_status(first_status).c_str());
    return WIFEXITED(first_status) ? WEXITSTATUS(first_status) : 128 + WTERMSIG(first_status);
  }
  return 0;
}
