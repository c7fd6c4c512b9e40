// One rank of a multi-process test, started by dtrain-run, mpirun or the fault tests, over TCP or,
// with DTRAIN_TEST_TRANSPORT=shm, over shared memory, or with DTRAIN_TEST_TRANSPORT=mixed over
// the mixed transport, rank r on the emulated host r % DTRAIN_TEST_HOSTS (shared memory between
// ranks of one host, TCP between hosts).
//
//   tcp_worker conformance     every collective and algorithm against the serial reference
//   tcp_worker allreduce-loop  allreduces of 1M floats for a few seconds, each result checked
//   tcp_worker mismatch        rank 0 calls allreduce while the others call broadcast
//   tcp_worker send-then-die   rank 1 sends rank 0 one message and SIGKILLs itself; rank 0,
//                              once the group has failed, must still receive that message
//   tcp_worker large-allreduce an allreduce of 2 GiB + 68 bytes of floats with every allreduce
//                              algorithm: messages past the 1 GiB frame cap go in parts
//   tcp_worker api             v collectives, 8-bit/bool/byte elements, a user's operator,
//                              nonblocking calls in any wait order, two threads (api_case.hpp)
//
// Fault hooks (environment): DTRAIN_TEST_KILL_RANK=k makes rank k SIGKILL itself in the middle
// of the allreduce loop (its sixth allreduce, or the first one DTRAIN_TEST_KILL_AFTER_MS after
// the loop began, whichever is later); DTRAIN_TEST_DELAY_MS=t delays every rank but 0 before it joins.
// Exit status: 0 success, 1 wrong result, 3 the expected failure was reported as documented,
// 2 anything else.

#include <signal.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>

#include "../collective/api_case.hpp"
#include "../collective/conformance_case.hpp"
#include "../collective/float_case.hpp"
#include "dtrain/transport/mixed.hpp"
#include "dtrain/transport/shm.hpp"
#include "dtrain/transport/tcp.hpp"

using namespace dtrain;
using namespace dtrain::conformance;
using clock_type = std::chrono::steady_clock;

namespace {

// steady_clock is CLOCK_MONOTONIC, one clock for every process of the machine: the fault tests
// compare a rank's time of death with the time each survivor reported it.
long long monotonic_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(clock_type::now().time_since_epoch()).count();
}

std::string transport_name() {
  const char* t = std::getenv("DTRAIN_TEST_TRANSPORT");
  return t != nullptr ? t : "tcp";
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoi(v) : fallback;
}

template <class T, class Comm>
bool run_one(Comm& c, const spec& s) {
  const std::vector<T> expect = expected_results<T>(s);
  bool ok = true;
  auto check = [&](int r, std::span<const T> got, const std::function<T(std::size_t)>& want) {
    for (std::size_t i = 0; i < got.size() && ok; ++i) {
      if (!(got[i] == want(i))) {
        std::fprintf(stderr, "WRONG: %s rank %d element %zu\n", describe_case(s, dtype_of_v<T>).c_str(), r, i);
        ok = false;
      }
    }
  };
  c.algorithms() = selection_table{};
  c.algorithms().force(s.op, s.algo);
  run_rank<T>(s, c.rank(), c, expect, check);
  return ok;
}

// Random floats through every reducing collective, form and algorithm (float_case.hpp): each
// result within the summation bound of the long double sum, allreduce's the same bits on every
// rank. @returns whether this rank saw every result right.
template <class Comm>
bool random_floats(Comm& c, int& cases) {
  const int p = c.size();
  bool ok = true;
  for (coll_op op : {coll_op::reduce, coll_op::allreduce, coll_op::reduce_scatter, coll_op::reduce_scatterv}) {
    for (algorithm a : all_algorithms) {
      if (!supports(op, a)) continue;
      c.algorithms() = selection_table{};
      c.algorithms().force(op, a);
      const bool blocks = op != coll_op::reduce && op != coll_op::allreduce;
      const std::size_t big = blocks ? std::size_t{65536} / static_cast<std::size_t>(p) + 3 : std::size_t{300007};
      for (std::size_t n : {std::size_t{1}, std::size_t{1000}, big}) {
        const bool large = n > 1000;  // past the 1 MiB segment: once, sum of floats out of place
        for (reduce_op rop : {reduce_op::sum, reduce_op::avg}) {
          for (int form = 0; form < 3 && !(large && (rop != reduce_op::sum || form > 0)); ++form) {
            const float_case::spec s{op,       a,         p,
                                     n,        rop,       static_cast<int>(n % static_cast<std::size_t>(p)),
                                     form == 1, form == 2, n * 131 + static_cast<std::size_t>(p)};
            std::string first;
            int bad = float_case::run_rank<float>(s, c.rank(), c, c, first);
            if (!large) bad += float_case::run_rank<double>(s, c.rank(), c, c, first);
            if (bad > 0) {
              std::fprintf(stderr, "WRONG: %s\n", first.c_str());
              ok = false;
            }
            cases += large ? 1 : 2;
          }
        }
      }
    }
  }
  return ok;
}

template <class Comm>
int run_conformance(Comm& c) {
  const int p = c.size();
  int cases = 0;
  bool ok = true;
  const coll_op ops[] = {coll_op::broadcast, coll_op::reduce, coll_op::allreduce, coll_op::reduce_scatter,
                         coll_op::allgather, coll_op::gather, coll_op::scatter, coll_op::alltoall};
  for (coll_op op : ops) {
    const bool reducing = takes_reduce_op(op);
    const bool blocks = op == coll_op::reduce_scatter || op == coll_op::allgather || op == coll_op::gather ||
                        op == coll_op::scatter || op == coll_op::alltoall;
    const bool has_in_place = op != coll_op::broadcast && op != coll_op::gather && op != coll_op::scatter;
    for (algorithm a : all_algorithms) {
      if (!supports(op, a)) continue;
      std::vector<std::size_t> counts{0, 1, 7, 1000,
                                      blocks ? std::size_t{65536} / static_cast<std::size_t>(p) + 3 : 300007};
      for (std::size_t n : counts) {
        const bool large = n > 1000;
        std::vector<int> roots = is_rooted(op) ? std::vector<int>{0, p - 1} : std::vector<int>{0};
        if (roots.size() == 2 && roots[0] == roots[1]) roots.pop_back();
        std::vector<reduce_op> rops = reducing && !large
                                          ? std::vector<reduce_op>{reduce_op::sum, reduce_op::prod, reduce_op::min,
                                                                   reduce_op::max, reduce_op::avg}
                                          : std::vector<reduce_op>{reduce_op::sum};
        std::vector<bool> places = has_in_place ? std::vector<bool>{false, true} : std::vector<bool>{false};
        for (int root : roots) {
          for (reduce_op rop : rops) {
            for (bool in_place : places) {
              spec s{op, a, p, n, rop, root, in_place};
              ok = run_one<float>(c, s) && ok;
              ok = run_one<std::int32_t>(c, s) && ok;
              if (!large) {
                ok = run_one<double>(c, s) && ok;
                ok = run_one<bfloat16>(c, s) && ok;
                cases += 2;
              }
              cases += 2;
            }
          }
        }
      }
    }
  }
  ok = random_floats(c, cases) && ok;
  // Barriers, each algorithm: no rank leaves before every rank has entered. CLOCK_MONOTONIC is
  // one clock for every process of the machine, so entry and exit times compare across ranks.
  for (algorithm a : {algorithm::dissemination, algorithm::binomial_tree}) {
    c.algorithms() = selection_table{};
    c.algorithms().force(coll_op::barrier, a);
    for (int round = 0; round < 5; ++round) {
      std::this_thread::sleep_for(std::chrono::milliseconds((c.rank() * 7 + round * 3) % 11));
      std::array<std::int64_t, 2> mine{monotonic_us(), 0};
      c.barrier();
      mine[1] = monotonic_us();
      std::vector<std::int64_t> all(2 * static_cast<std::size_t>(p));
      c.allgather(std::span<const std::int64_t>(mine), std::span<std::int64_t>(all));
      std::int64_t last_entry = 0;
      for (int r = 0; r < p; ++r) last_entry = std::max(last_entry, all[2 * static_cast<std::size_t>(r)]);
      if (mine[1] < last_entry) {
        std::fprintf(stderr, "WRONG: barrier (%s) round %d: rank %d left %lld us before the last rank entered\n",
                     std::string(algorithm_name(a)).c_str(), round, c.rank(),
                     static_cast<long long>(last_entry - mine[1]));
        ok = false;
      }
      ++cases;
    }
  }

  // Every rank's verdict counts: the group's count of ranks with a wrong result decides every
  // rank's exit status, so a launcher that reports any one rank reports them all.
  int wrong_ranks = ok ? 0 : 1;
  c.allreduce(std::span(&wrong_ranks, 1), reduce_op::sum);
  std::printf("conformance: %d cases on %d ranks over %s: rank %d %s; %s\n", cases, p, transport_name().c_str(),
              c.rank(), ok ? "correct" : "WRONG", wrong_ranks == 0 ? "all correct" : "WRONG RESULTS on some rank");
  return wrong_ranks == 0 ? 0 : 1;
}

template <class Comm>
int allreduce_loop(Comm& c) {
  const int kill_rank = env_int("DTRAIN_TEST_KILL_RANK", -1);
  const auto duration = std::chrono::milliseconds(env_int("DTRAIN_TEST_LOOP_MS", 2000));
  const auto kill_after = std::chrono::milliseconds(env_int("DTRAIN_TEST_KILL_AFTER_MS", 0));
  bool dying = false;
  const std::size_t n = 1 << 20;
  std::vector<float> v(n);
  const float expect = static_cast<float>(c.size() * (c.size() + 1) / 2);
  auto start = clock_type::now();
  int iterations = 0;
  while (true) {
    // Rank 0 decides when the loop ends, so every rank runs the same number of allreduces.
    int go = clock_type::now() - start < duration ? 1 : 0;
    c.broadcast(std::span(&go, 1), 0);
    if (go == 0) break;
    std::fill(v.begin(), v.end(), static_cast<float>(c.rank() + 1));
    if (c.rank() == kill_rank && !dying && iterations >= 5 && clock_type::now() - start >= kill_after) {
      dying = true;
      // Mid-collective: post the first sends, then die without any goodbye.
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        std::printf("dying at monotonic %lld us\n", monotonic_us());
        std::fflush(stdout);
        ::raise(SIGKILL);
      }).detach();
    }
    c.allreduce(std::span(v), reduce_op::sum);
    for (float x : v) {
      if (x != expect) {
        std::fprintf(stderr, "WRONG: allreduce gave %g where %g was expected\n", static_cast<double>(x),
                     static_cast<double>(expect));
        return 1;
      }
    }
    ++iterations;
  }
  std::printf("allreduce-loop: rank %d ran %d allreduces, all correct\n", c.rank(), iterations);
  return 0;
}

template <class Comm>
int mismatch(Comm& c) {
  std::vector<float> v(1000, 1.0f);
  if (c.rank() == 0) {
    c.allreduce(std::span(v), reduce_op::sum);
  } else {
    c.broadcast(std::span(v), 0);
  }
  std::fprintf(stderr, "a mismatched collective was not detected\n");
  return 2;
}

template <class Comm>
int send_then_die(Comm& c) {
  auto& t = c.transport();
  constexpr std::uint64_t tag = 7;
  if (c.rank() == 1) {
    const int value = 42;
    t.isend(0, tag, signature{}, std::as_bytes(std::span(&value, 1))).wait(deadline::after(std::chrono::seconds(10)));
    std::fflush(stdout);
    ::raise(SIGKILL);
  }
  if (c.rank() != 0) return 0;
  // Wait until the death has failed the group: a receive from rank 1 on another tag fails.
  int ignored = 0;
  std::error_code ec;
  t.irecv(1, tag + 1, std::as_writable_bytes(std::span(&ignored, 1)))
      .wait(deadline::after(std::chrono::seconds(10)), ec);
  int got = 0;
  t.irecv(1, tag, std::as_writable_bytes(std::span(&got, 1))).wait(deadline::after(std::chrono::seconds(10)));
  std::printf("the group failed (%s); the message sent before it still arrived: %d\n", ec.message().c_str(), got);
  return got == 42 && ec == errc::peer_lost ? 0 : 1;
}

// Every allreduce algorithm on a buffer past the TCP frame cap (2^29 + 17 floats: halving-doubling
// sends halves of 1 GiB, recursive doubling the whole 2 GiB at once), each element checked.
// Exit status 0 when every rank saw every element right (the verdicts are summed), 1 otherwise.
// VmHWM of /proc/self/status, in bytes.
double peak_resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  double kib = 0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, "VmHWM: %lf kB", &kib) == 1) break;
  }
  std::fclose(f);
  return kib * 1024;
}

// Starts VmHWM again from the current resident size (Linux: "5" to clear_refs).
void reset_peak_resident() {
  if (std::FILE* f = std::fopen("/proc/self/clear_refs", "w")) {
    std::fputs("5", f);
    std::fclose(f);
  }
}

template <class Comm>
int large_allreduce(Comm& c) {
  // 2 GiB + 68 bytes, or DTRAIN_TEST_LARGE_FLOATS floats.
  const int asked = env_int("DTRAIN_TEST_LARGE_FLOATS", 0);
  const std::size_t n = asked > 0 ? static_cast<std::size_t>(asked) : (std::size_t{1} << 29) + 17;
  const int p = c.size(), r = c.rank();
  std::vector<float> v;
  long wrong = 0;
  double peak = 0;  // the largest of each algorithm's peak resident size
  for (algorithm a : {algorithm::ring, algorithm::halving_doubling, algorithm::recursive_doubling,
                      algorithm::binomial_tree, algorithm::double_binary_tree}) {
    v.assign(n, 0.0f);
    for (std::size_t i = 0; i < n; ++i)
      v[i] = static_cast<float>(i % 7 + static_cast<std::size_t>(r));  // sums exact in float
    reset_peak_resident();
    const auto start = clock_type::now();
    c.allreduce(std::span(v), reduce_op::sum, a);
    long bad = 0;
    for (std::size_t i = 0; i < n; ++i)
      bad += v[i] != static_cast<float>(p * static_cast<int>(i % 7) + p * (p - 1) / 2);
    peak = std::max(peak, peak_resident_bytes());
    std::printf("large allreduce: rank %d, %s, %zu bytes, %.1f s, %ld wrong, peak resident %.2f GB\n", r,
                std::string(algorithm_name(a)).c_str(), n * sizeof(float),
                std::chrono::duration<double>(clock_type::now() - start).count(), bad, peak_resident_bytes() / 1e9);
    std::fflush(stdout);
    wrong += bad;
  }
  v = {};
  // Peak memory: the buffer, the algorithm's scratch (recursive doubling's is a whole buffer) and
  // what the transport holds. Parts past the cap wait for the receiver's clear-to-send, so no
  // rank keeps a whole early message as well: at most 3.5 buffers a rank (8.3 GB on 4 ranks before).
  const double limit = 3.5 * static_cast<double>(n * sizeof(float));
  if (peak > limit)
    std::printf("large allreduce: rank %d peak resident %.2f GB over the limit %.2f GB\n", r, peak / 1e9, limit / 1e9);
  std::vector<std::int64_t> verdict{wrong > 0 || peak > limit ? 1 : 0};
  c.allreduce(std::span(verdict), reduce_op::sum);
  return verdict[0] == 0 ? 0 : 1;
}

// Every check of api_case.hpp; each rank's count of wrong results is summed, so every rank
// exits 1 when any rank saw one.
template <class Comm>
int api(Comm& c) {
  int wrong = 0;
  for (unsigned seed : {1u, 2u}) {
    wrong += api_case::uneven<float>(c, seed, 3000);
    wrong += api_case::uneven<std::byte>(c, seed, 70000);
  }
  for (std::size_t n : {std::size_t{0}, std::size_t{7}, std::size_t{70001}}) wrong += api_case::small_types(c, n);
  for (std::size_t n : {std::size_t{1}, std::size_t{5000}}) wrong += api_case::user_operator(c, n);
  for (std::size_t n : {std::size_t{1}, std::size_t{777}, std::size_t{300000}}) {
    wrong += api_case::nonblocking(c, n, static_cast<unsigned>(n));
  }
  wrong += api_case::two_threads(c, 4096, 100);
  std::vector<std::int64_t> verdict{wrong};
  c.allreduce(std::span(verdict), reduce_op::sum);
  if (c.rank() == 0) std::printf("api: %lld wrong results over all ranks\n", static_cast<long long>(verdict[0]));
  return verdict[0] == 0 ? 0 : 1;
}

// DTRAIN_TEST_EXPECT_PATHS=single-copy (with a small DTRAIN_SHM_SINGLE_COPY_BYTES): after a run
// that passed, every rank (each shares its host in these tests) must have sent small messages
// through the rings and every large one by single copy, with no fallback it did not ask for.
// Every rank's verdict counts.
template <class Comm>
int check_paths(Comm& c, const std::optional<shm_stats>& s, int status) {
  const char* expect = std::getenv("DTRAIN_TEST_EXPECT_PATHS");
  if (expect == nullptr || status != 0) return status;
  std::int64_t wrong = 0;
  if (std::string(expect) != "single-copy") {
    std::fprintf(stderr, "DTRAIN_TEST_EXPECT_PATHS=%s: only single-copy is known\n", expect);
    wrong = 1;
  } else if (s) {
    for (const auto& f : s->fallbacks) {
      std::fprintf(stderr, "rank %d: a fallback not asked for: %s\n", c.rank(), f.c_str());
    }
    std::printf("rank %d sent %llu messages through the rings (%llu large) and %llu by single copy\n", c.rank(),
                static_cast<unsigned long long>(s->ring_messages),
                static_cast<unsigned long long>(s->large_ring_messages),
                static_cast<unsigned long long>(s->single_copy_messages));
    if (!s->fallbacks.empty() || s->ring_messages == 0 || s->single_copy_messages == 0 || s->large_ring_messages > 0) {
      wrong = 1;
    }
  } else if (c.size() > 1) {
    std::fprintf(stderr, "rank %d: no shared-memory statistics: it shares its host with no rank\n", c.rank());
    wrong = 1;
  }
  std::vector<std::int64_t> verdict{wrong};
  c.allreduce(std::span(verdict), reduce_op::sum);
  return verdict[0] == 0 ? 0 : 1;
}

template <class Comm>
int run_mode(const std::string& mode, Comm& c) {
  if (mode == "conformance") return run_conformance(c);
  if (mode == "allreduce-loop") return allreduce_loop(c);
  if (mode == "mismatch") return mismatch(c);
  if (mode == "send-then-die") return send_then_die(c);
  if (mode == "large-allreduce") return large_allreduce(c);
  if (mode == "api") return api(c);
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "conformance";
  auto t0 = clock_type::now();
  try {
    tcp_options o;
    o.timeout = std::chrono::milliseconds(env_int("DTRAIN_TIMEOUT_MS", 60000));
    if (int delay = env_int("DTRAIN_TEST_DELAY_MS", 0); delay > 0 && env_int("DTRAIN_RANK", 0) != 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(delay));
    }
    communicator_options co;
    co.timeout = o.timeout;
    if (transport_name() == "shm") {
      shm_options so;
      so.timeout = o.timeout;
      communicator<shm_transport> c(shm_transport::from_environment(so), co);
      const int status = run_mode(mode, c);
      return check_paths(c, c.size() > 1 ? std::optional(c.transport().stats()) : std::nullopt, status);
    }
    if (transport_name() == "mixed") {
      mixed_options mo;
      mo.tcp = o;
      mo.shm.timeout = o.timeout;
      mo.host_id = "emulated-host-" + std::to_string(env_int("DTRAIN_RANK", 0) % env_int("DTRAIN_TEST_HOSTS", 1));
      communicator<mixed_transport> c(mixed_transport::from_environment(mo), co);
      const int status = run_mode(mode, c);
      return check_paths(c, c.transport().host_stats(), status);
    }
    communicator<tcp_transport> c(tcp_transport::from_environment(o), co);
    return run_mode(mode, c);
  } catch (const dtrain::error& e) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - t0).count();
    std::printf("caught dtrain::error [%s] after %lld ms (at monotonic %lld us): %s\n", e.code().message().c_str(),
                static_cast<long long>(ms), monotonic_us(), e.what());
    std::fflush(stdout);
    return 3;
  }
}
