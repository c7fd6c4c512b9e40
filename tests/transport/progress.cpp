// The default progress policy: a waiter spins only where the host has two cores for each of the
// group's ranks on it. The rule against its closed form, the spin a request hands its transport
// under each policy, and the ranks a TCP and a shared-memory group count on this host.

#include <sched.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>

#include "../catch.hpp"
#include "../support/thread_ranks.hpp"
#include "dtrain/transport/shm.hpp"
#include "dtrain/transport/tcp.hpp"

using namespace dtrain;
using namespace std::chrono_literals;

namespace {

// An owner that records the spin each wait is given, and whether it says it has cores to spare.
struct recording_owner {
  bool spare = false;
  std::chrono::microseconds last{-1};
  bool spare_cores() const noexcept { return spare; }
  bool wait(const std::shared_ptr<detail::byte_operation>&, deadline, std::chrono::microseconds spin) {
    last = spin;
    return true;
  }
  void cancel(const std::shared_ptr<detail::byte_operation>&) {}
};

template <class Progress>
std::chrono::microseconds spin_given(bool spare) {
  auto owner = std::make_shared<recording_owner>();
  owner->spare = spare;
  auto op = std::make_shared<detail::byte_operation>();
  op->flag.set();  // so that the destructor's cancel finds it done
  transport_request<recording_owner, detail::byte_operation, Progress> r(owner, op);
  std::error_code ec;
  REQUIRE(r.wait(deadline::after(1s), ec));
  return owner->last;
}

const std::string token = "test-token";

// Lets the calling thread (a rank's, so no Catch2 assertion here) run on two of its cores only
// (where it has two), so that the rule's answer depends on the ranks counted whatever the host:
// one rank spins, two do not. @returns the cores the thread may now use.
unsigned two_cores_only() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) throw std::runtime_error("sched_getaffinity failed");
  cpu_set_t two;
  CPU_ZERO(&two);
  int kept = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE && kept < 2; ++cpu) {
    if (CPU_ISSET(cpu, &set)) CPU_SET(cpu, &two), ++kept;
  }
  if (::sched_setaffinity(0, sizeof two, &two) != 0) throw std::runtime_error("sched_setaffinity failed");
  return detail::usable_cores();
}

}  // namespace

TEST_CASE("progress: two cores for each rank on the host, no fewer", "[progress]") {
  CHECK(detail::spare_cores_for(1, 2));
  CHECK_FALSE(detail::spare_cores_for(2, 2));
  CHECK_FALSE(detail::spare_cores_for(1, 1));
  CHECK(detail::spare_cores_for(8, 16));
  CHECK_FALSE(detail::spare_cores_for(9, 16));
  CHECK(detail::spare_cores_for(64, 128));
  CHECK_FALSE(detail::spare_cores_for(65, 128));
  CHECK(detail::spare_cores_for(0, 2));  // a group has at least this rank here
  CHECK(detail::usable_cores() >= 1);
}

TEST_CASE("progress: a request hands its transport the policy's spin, the default's only with cores to spare",
          "[progress]") {
  CHECK(spin_given<default_progress>(true) == 1000us);
  CHECK(spin_given<default_progress>(false) == 0us);
  CHECK(spin_given<spin_with_spare_cores<70>>(true) == 70us);
  CHECK(spin_given<blocking>(true) == 0us);
  CHECK(spin_given<spin_then_block<50>>(false) == 50us);
  CHECK(spin_given<spin_then_block<50>>(true) == 50us);
}

TEST_CASE("progress: a TCP group counts its ranks on this host by its connections' addresses", "[progress][tcp]") {
  // Every rank connects over loopback, so all of them are here; each rank's thread runs on two
  // cores (where it has two): one rank alone spins, two or three do not.
  tcp_options o;
  o.token = token;
  o.timeout = 20s;
  for (int n : {1, 2, 3}) {
    INFO(n << " ranks");
    auto connect = [&](tcp_store& store, int r) {
      const unsigned cores = two_cores_only();
      auto t = tcp_transport::connect(store, r, n, o, "127.0.0.1");
      if (t.spare_cores() != detail::spare_cores_for(n, cores)) throw std::runtime_error("a TCP group miscounted");
      if (cores == 2 && t.spare_cores() != (n == 1)) throw std::runtime_error("two cores, but not the rule's answer");
      return t;
    };
    testing::run_thread_ranks(n, token, connect, [](int, tcp_transport&) {});
  }
}

TEST_CASE("progress: a shared-memory group's ranks are all on this host", "[progress][shm]") {
  shm_options o;
  o.token = token;
  o.ring_bytes = 4096;
  for (int n : {1, 2, 3}) {
    INFO(n << " ranks");
    auto connect = [&](tcp_store& store, int r) {
      const unsigned cores = two_cores_only();
      auto t = shm_transport::connect(store, r, n, o);
      if (t.spare_cores() != detail::spare_cores_for(n, cores)) throw std::runtime_error("a shm group miscounted");
      return t;
    };
    testing::run_thread_ranks(n, token, connect, [](int, shm_transport&) {});
  }
}
