// One rank of a parameter-server job over TCP, in a real process (started by dtrain-run or by the
// fault tests). Servers are the first DTRAIN_PS_SERVERS ranks.
//
//   ps_worker bsp        synchronous SGD under BSP; every worker checks its parameters against the
//                        serial simulation, prints "ps bsp: ... match" and exits 1 if they differ
//   ps_worker asp        Downpour under ASP; each worker checks its final loss
//   ps_worker ssp        stale synchronous SGD under SSP(2); each worker checks its final loss
//   ps_worker asp-exact  Downpour under ASP with SGD on the servers and gradients that are
//   ps_worker ssp-exact  multiples of 2^-12 (lr 2^-5), so that every sum is exact in float and the
//                        final parameters are x0 - lr * (the sum of every push), in any order. With
//                        DTRAIN_TEST_PUSH_LOG=prefix each worker writes to prefix.w<w> every step's
//                        begin and end (CLOCK_MONOTONIC ns), every push it made (worker, step and
//                        values), and its final pull, which it makes once every worker has written
//                        prefix.done<w>: the test computes the reference from these (faults.cpp).
//
// Fault hooks (environment): DTRAIN_TEST_KILL_RANK=k and DTRAIN_TEST_KILL_STEP=s make rank k
// SIGKILL itself at step s (a server counts its requests instead); DTRAIN_TEST_POLICY=drop keeps
// going without a dead worker; DTRAIN_TEST_HEARTBEAT_MS sets the heartbeat timeout;
// DTRAIN_TEST_SLOW_MS=m sleeps m ms after every step (only worker DTRAIN_TEST_SLOW_WORKER's, if set);
// DTRAIN_TEST_CHECKPOINT=prefix checkpoints every DTRAIN_TEST_CHECKPOINT_EVERY clocks, and with
// DTRAIN_TEST_RESUME=1 the job starts from those checkpoints; DTRAIN_TEST_REPLICAS=k keeps k
// copies of each shard. Servers print the version of every shard they head at the end
// ("shard s version v"), workers the pushes each shard acknowledged ("acknowledged s n");
// DTRAIN_TEST_LEAVE_RANK=r makes server r leave the job cleanly 300 ms in (`server::leave`).
// DTRAIN_TEST_KILL_LATER_RANK=r SIGKILLs server r after DTRAIN_TEST_KILL_LATER_MS (1000) ms.
// DTRAIN_TEST_LEAVE_WORKER=w with DTRAIN_TEST_LEAVE_AFTER=s makes worker w leave the job after s
// steps (under BSP the others go on, averaging over themselves from the next round).
// With DTRAIN_PS_STANDBY=n the last n ranks are standby servers; with DTRAIN_LATE_RANKS=n too and
// DTRAIN_TEST_LATE_MS=m they join the TCP group m ms after it formed, as processes started later. Every server prints a
// digest of each copy it holds at the end ("copy of shard s: version v digest d"), so a test can check that the copies
// are equal. DTRAIN_PS_LATE_WORKERS=n: the last n workers join the running job (with DTRAIN_LATE_RANKS and
// DTRAIN_TEST_LATE_MS, as processes that connect later). Under BSP the harness decides where one
// enters, DTRAIN_TEST_ENTER_AT=c: worker 0 holds before its step c - 1, writing
// DTRAIN_TEST_HOLD_FILE, until the late worker has entered (it writes DTRAIN_TEST_JOIN_FILE once
// every shard took it); the late worker connects only once the hold file exists. With round c - 1
// held open the late worker must enter at c (past every round in progress): it fails where it
// did not, and every worker's simulation counts it from c. In a resumed job
// DTRAIN_TEST_RESUMED_AT=c is the clock the harness read from the checkpoint files' names (every
// worker fails where the job resumed elsewhere), and DTRAIN_TEST_FIRST_JOIN=c says the late
// worker had entered the job before the restart at clock c: the simulation counts it from c to the
// resumed clock, then from its second arrival on.
// Workers print when they began and ended training ("worker w began at t ms", since the process
// started). Exit status: 0 success, 1 wrong result, 3 a dtrain::error was caught (and printed),
// 4 the harness's hold or the others' finishing did not come within its time.

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "dtrain/consistency/policies.hpp"
#include "dtrain/core/log.hpp"
#include "dtrain/core/hash.hpp"
#include "dtrain/ps/trainer.hpp"
#include "dtrain/transport/tcp.hpp"
#include "dtrain/updater/adagrad.hpp"
#include "dtrain/updater/sgd.hpp"
#include "problem.hpp"

using namespace dtrain;
using namespace dtrain::ps;
using dtrain::testing::dim;
using dtrain::testing::problem;

namespace {

const auto process_start = std::chrono::steady_clock::now();
long long ms_since_start() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - process_start)
      .count();
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoi(v) : fallback;
}

// A clock one process hands to another through a file (a path from the environment, or none).
void write_clock(const char* path, std::int64_t clock) {
  if (path == nullptr) return;
  if (std::FILE* out = std::fopen(path, "w"); out != nullptr) {
    std::fprintf(out, "%lld\n", static_cast<long long>(clock));
    std::fclose(out);
  }
}

// The late worker tells worker 0 it has entered through its log handler: the library logs the
// entry once every shard took it, before the pull that waits for the round worker 0 holds open.
// Other lines go to stderr as they would have.
const char* join_file = nullptr;
void on_log(dtrain::log_level level, std::string_view line) {
  if (line.find("joins the running job at clock") != std::string_view::npos) {
    write_clock(join_file, 0);
  } else if (level <= dtrain::log_level::warn) {
    std::fprintf(stderr, "dtrain %s: %.*s\n", level == dtrain::log_level::warn ? "warn" : "error",
                 static_cast<int>(line.size()), line.data());
  }
}

// Waits up to 30 s for the file at the path the environment variable `name` gives (none: returns
// at once); whether it appeared.
bool wait_for_file(const char* name) {
  const char* path = std::getenv(name);
  if (path == nullptr) return true;
  for (auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30); ::access(path, F_OK) != 0;) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

ps_options options() {
  ps_options o;
  o.timeout = std::chrono::milliseconds(env_int("DTRAIN_TEST_TIMEOUT_MS", 30000));
  o.heartbeat_interval = std::chrono::milliseconds(100);
  // 4 values a slice by default: the 12-value model spreads over every server
  o.dense_slice_bytes = static_cast<std::size_t>(env_int("DTRAIN_TEST_SLICE_BYTES", 16));
  o.heartbeat_timeout = std::chrono::milliseconds(env_int("DTRAIN_TEST_HEARTBEAT_MS", 5000));
  o.replicas = env_int("DTRAIN_TEST_REPLICAS", 1);
  if (const char* p = std::getenv("DTRAIN_TEST_POLICY"); p != nullptr && std::string(p) == "drop") {
    o.on_dead_worker = dead_worker_policy::drop;
  }
  if (const char* c = std::getenv("DTRAIN_TEST_CHECKPOINT"); c != nullptr) {
    o.checkpoint_prefix = c;
    o.checkpoint_every = env_int("DTRAIN_TEST_CHECKPOINT_EVERY", 5);
    o.resume = env_int("DTRAIN_TEST_RESUME", 0) != 0;
  }
  return o;
}

void maybe_die(int rank, int step) {
  if (env_int("DTRAIN_TEST_KILL_RANK", -1) == rank && env_int("DTRAIN_TEST_KILL_STEP", -1) == step) {
    std::fflush(stdout);
    ::kill(::getpid(), SIGKILL);
  }
}

// The exact modes' record of one worker (see the top of this file); a no-op without
// DTRAIN_TEST_PUSH_LOG. Gradients become multiples of 2^-12, and pushes mirror Downpour's rule
// (push the sum of the last n_push gradients when (t + 1) % n_push == 0) with the same float sums.
class push_log {
 public:
  push_log(bool exact, int worker, int n_push) : worker_(worker), n_push_(n_push), last_(dim), pending_(dim, 0.0f) {
    const char* prefix = std::getenv("DTRAIN_TEST_PUSH_LOG");
    if (!exact || prefix == nullptr) return;
    prefix_ = prefix;
    file_ = std::fopen((prefix_ + ".w" + std::to_string(worker)).c_str(), "w");
  }
  push_log(const push_log&) = delete;
  push_log& operator=(const push_log&) = delete;
  ~push_log() {
    if (file_ != nullptr) std::fclose(file_);
  }

  static long long now() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void gradient(std::span<float> g) {
    if (file_ == nullptr) return;
    for (float& v : g) v = std::ldexp(std::nearbyint(std::ldexp(v, 12)), -12);
    std::copy(g.begin(), g.end(), last_.begin());
  }
  void stepped(int it, long long began) {
    if (file_ == nullptr) return;
    std::fprintf(file_, "step %d %lld %lld\n", it, began, now());
    for (std::size_t j = 0; j < dim; ++j) pending_[j] += last_[j];
    if ((it + 1) % n_push_ == 0) {
      std::fprintf(file_, "push %d %d", worker_, it);
      for (float v : pending_) std::fprintf(file_, " %a", static_cast<double>(v));
      std::fputc('\n', file_);
      std::fill(pending_.begin(), pending_.end(), 0.0f);
    }
    std::fflush(file_);  // kept if this process is killed next
  }
  // Says this worker's pushes are done and waits until every worker's are: the final pull then
  // sees all of them.
  bool all_done(int workers) const {
    if (file_ == nullptr) return true;
    std::fclose(std::fopen((prefix_ + ".done" + std::to_string(worker_)).c_str(), "w"));
    for (int k = 0; k < workers; ++k) {
      const std::string done = prefix_ + ".done" + std::to_string(k);
      for (int ms = 0; ::access(done.c_str(), F_OK) != 0; ms += 5) {
        if (ms > 60000) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    return true;
  }
  void final_pull(std::span<const float> x) {
    if (file_ == nullptr) return;
    std::fprintf(file_, "final %d", worker_);
    for (float v : x) std::fprintf(file_, " %a", static_cast<double>(v));
    std::fputc('\n', file_);
    std::fflush(file_);
  }

 private:
  int worker_, n_push_;
  std::string prefix_;
  std::FILE* file_ = nullptr;
  std::vector<float> last_, pending_;
};

template <class Consistency, class Updater, class Algorithm>
int run(tcp_transport t, Updater u, Algorithm a, int steps, bool check_bsp, bool exact = false) {
  const int rank = t.rank();
  const roles r = roles::from_environment(t.size());
  trainer<tcp_transport, Consistency, Updater, Algorithm> job(std::move(t), std::move(u), std::move(a), r, options());
  if (job.is_server()) {
    if (env_int("DTRAIN_TEST_KILL_RANK", -1) == rank) {  // a server dies after a while
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        maybe_die(env_int("DTRAIN_TEST_KILL_RANK", -1), env_int("DTRAIN_TEST_KILL_STEP", -1));
      }).detach();
    }
    if (env_int("DTRAIN_TEST_KILL_LATER_RANK", -1) == rank) {  // and another one later
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(env_int("DTRAIN_TEST_KILL_LATER_MS", 1000)));
        std::fflush(stdout);
        ::kill(::getpid(), SIGKILL);
      }).detach();
    }
    std::jthread leaving;  // DTRAIN_TEST_LEAVE_RANK: this server leaves the job cleanly after 300 ms
    if (env_int("DTRAIN_TEST_LEAVE_RANK", -1) == rank) {
      leaving = std::jthread([&job](std::stop_token stop) {
        for (int ms = 0; ms < 300 && !stop.stop_requested(); ms += 10)
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        job.server_endpoint().leave();
      });
    }
    const auto& st = job.serve();
    const bool left = leaving.joinable();
    if (left) {
      leaving.request_stop();
      leaving.join();
      std::printf("server %d left the job\n", rank);
    }
    std::printf("server %d: %llu updates, %llu pushes, %llu pulls\n", rank, static_cast<unsigned long long>(st.version),
                static_cast<unsigned long long>(st.pushes), static_cast<unsigned long long>(st.pulls));
    auto& server = job.server_endpoint();
    for (int s = 0; s < r.shard_count(); ++s) {
      if (server.heads(s))
        std::printf("shard %d version %llu\n", s, static_cast<unsigned long long>(server.version_of(s)));
    }
    for (int s : left ? std::vector<int>{} : server.held_shards()) {  // one that left holds none
      dtrain::fnv1a digest;
      for (auto* table : {&server.shard_tables(s).sparse(), &server.shard_tables(s).dense()}) {
        table->for_each([&](std::uint64_t key, auto values, auto state) {
          digest.word(key).bytes(std::as_bytes(values)).bytes(std::as_bytes(state));
        });
      }
      std::printf("copy of shard %d: version %llu digest %016llx\n", s,
                  static_cast<unsigned long long>(server.version_of(s)),
                  static_cast<unsigned long long>(digest.value()));
    }
    return 0;
  }
  const int w = r.worker_of(rank);
  problem p(w);
  std::vector<float> x(dim);
  job.begin(std::span(x));
  std::printf("worker %d began at %lld ms\n", w, ms_since_start());
  const int enter_at = env_int("DTRAIN_TEST_ENTER_AT", -1), resumed_at = env_int("DTRAIN_TEST_RESUMED_AT", 0);
  if (job.first_step() > 0 && w == 0)
    std::printf("worker 0 resumes at step %lld\n", static_cast<long long>(job.first_step()));
  if (r.is_late_worker(w)) {
    std::printf("worker %d entered the running job at clock %lld\n", w, static_cast<long long>(job.first_step()));
    if (enter_at >= 0 && job.first_step() != enter_at) {
      std::printf("worker %d entered at clock %lld, not at %d where the harness held the job\n", w,
                  static_cast<long long>(job.first_step()), enter_at);
      return 1;
    }
  } else if (resumed_at > 0 && job.first_step() != resumed_at) {
    std::printf("worker %d resumed at step %lld, but the newest checkpoint every shard has is of clock %d\n", w,
                static_cast<long long>(job.first_step()), resumed_at);
    return 1;
  }
  const int leaver = env_int("DTRAIN_TEST_LEAVE_WORKER", -1), leave_after = env_int("DTRAIN_TEST_LEAVE_AFTER", steps);
  if (w == leaver) steps = leave_after;
  push_log log(exact, w, env_int("DTRAIN_TEST_N_PUSH", 1));
  for (int it = static_cast<int>(job.first_step()); it < steps; ++it) {
    maybe_die(rank, it);
    if (w == 0 && it == enter_at - 1) {  // hold round it open until the late worker entered
      write_clock(std::getenv("DTRAIN_TEST_HOLD_FILE"), it);
      if (!wait_for_file("DTRAIN_TEST_JOIN_FILE")) {
        std::printf("worker 0: no late worker entered within 30 s\n");
        return 4;
      }
    }
    const long long began = log.now();
    job.step(std::span(x), [&](auto xs, auto g, std::int64_t tt) {
      p.grad(xs, g, tt);
      log.gradient(g);
    }, it);
    log.stepped(it, began);  // step returns once its push is acknowledged
    const int slow_worker = env_int("DTRAIN_TEST_SLOW_WORKER", -1);  // -1: every worker
    if (env_int("DTRAIN_TEST_SLOW_MS", 0) > 0 && (slow_worker < 0 || slow_worker == w)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(env_int("DTRAIN_TEST_SLOW_MS", 0)));
    }
  }
  std::printf("worker %d ended at %lld ms\n", w, ms_since_start());
  if (!log.all_done(r.workers)) {
    std::printf("worker %d: not every worker finished its steps within 60 s\n", w);
    return 4;
  }
  job.end(std::span(x));
  log.final_pull(x);
  const auto& acknowledged = job.worker_endpoint().stats().pushes_acknowledged;
  for (std::size_t s = 0; s < acknowledged.size(); ++s) {
    std::printf("acknowledged %zu %llu\n", s, static_cast<unsigned long long>(acknowledged[s]));
  }
  if (check_bsp) {
    // Serial synchronous SGD on the mean gradient, with the server's float operations; from
    // round `leave_after` on without the worker that left. The one that left pulls once more
    // after its last step (`end` finishes a clock first): it sees one round without it. A late
    // worker counts from the clock the harness made it enter at (DTRAIN_TEST_ENTER_AT), and after
    // a restart also in the rounds it was there for before the restart, [first_join, resumed_at).
    const long long entered = std::max(enter_at, 0), first_join = env_int("DTRAIN_TEST_FIRST_JOIN", -1);
    auto late_counts = [&](int it) {
      return it >= entered || (first_join >= 0 && it >= first_join && it < resumed_at);
    };
    std::vector<problem> all;
    for (int k = 0; k < r.workers; ++k) all.emplace_back(k);
    std::vector<float> center(dim, 0.0f), g(dim);
    const int rounds = w == leaver ? leave_after + 1 : steps;
    for (int it = 0; it < rounds; ++it) {
      std::vector<float> acc(dim, 0.0f);
      int pushed = 0;
      for (int k = 0; k < r.workers; ++k) {
        if (k == leaver && it >= leave_after) continue;
        if (r.is_late_worker(k) && !late_counts(it)) continue;
        all[static_cast<std::size_t>(k)].grad(center, g, it);
        for (std::size_t j = 0; j < dim; ++j) acc[j] += g[j];
        ++pushed;
      }
      for (std::size_t j = 0; j < dim; ++j) center[j] -= 0.05f * (acc[j] * (1.0f / static_cast<float>(pushed)));
    }
    // Every worker checks its own parameters and exits 1 on a difference; dtrain-run fails the
    // job when any one does.
    const bool ok = x == center;
    std::printf("ps bsp: %d servers, %d workers over TCP, %d steps: worker %d's parameters %s the serial simulation\n",
                r.servers, r.workers, steps, w, ok ? "match" : "DO NOT match");
    return ok ? 0 : 1;
  }
  const float loss = p.loss(x);
  std::printf("ps %.*s: worker %d final loss %.5f\n", static_cast<int>(Consistency::name.size()),
              Consistency::name.data(), w, static_cast<double>(loss));
  return loss < 0.05f ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "bsp";
  const auto t0 = std::chrono::steady_clock::now();
  try {
    tcp_options o;
    o.abort_group_on_peer_loss = false;  // the servers decide what a lost worker means
    if (const int late = env_int("DTRAIN_LATE_RANKS", 0);
        late > 0 && env_int("DTRAIN_RANK", 0) >= env_int("DTRAIN_WORLD_SIZE", 0) - late) {
      std::this_thread::sleep_for(std::chrono::milliseconds(env_int("DTRAIN_TEST_LATE_MS", 0)));
      if (!wait_for_file("DTRAIN_TEST_HOLD_FILE")) {
        std::printf("late rank: worker 0 did not hold the job within 30 s\n");
        return 4;
      }
      if (join_file = std::getenv("DTRAIN_TEST_JOIN_FILE"); join_file != nullptr) {
        ::setenv("DTRAIN_LOG", "info", 1);  // before dtrain logs anything: the entry is an info line
        dtrain::set_log_handler(on_log);
      }
    }
    auto t = tcp_transport::from_environment(o);
    if (mode == "bsp")
      return run<bsp>(std::move(t), sgd<float>(0.05), sync_sgd<float>(), env_int("DTRAIN_TEST_STEPS", 30), true);
    if (mode == "asp")
      return run<asp>(std::move(t), adagrad<float>(0.2), downpour<float>(2, 2), env_int("DTRAIN_TEST_STEPS", 150),
                      false);
    if (mode == "ssp")
      return run<ssp<2>>(std::move(t), adagrad<float>(0.2), sync_sgd<float>(), env_int("DTRAIN_TEST_STEPS", 150),
                         false);
    if (mode == "asp-exact") {
      return run<asp>(std::move(t), sgd<float>(0.03125f), downpour<float>(2, 2), env_int("DTRAIN_TEST_STEPS", 150),
                      false, true);
    }
    if (mode == "ssp-exact") {
      return run<ssp<2>>(std::move(t), sgd<float>(0.03125f), sync_sgd<float>(), env_int("DTRAIN_TEST_STEPS", 150),
                         false, true);
    }
    std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
    return 2;
  } catch (const dtrain::error& e) {
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    std::printf("caught dtrain::error [%s] after %lld ms: %s\n", e.code().message().c_str(), static_cast<long long>(ms),
                e.what());
    std::fflush(stdout);
    return 3;
  }
}
