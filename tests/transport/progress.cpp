// The default progress policy: a waiter spins only where the host has two cores for each of the
// group's ranks on it. The rule against its closed form, the spin a request hands its transport
// under each policy, the transports' default, which addresses are one host's, and the ranks a TCP
// and a shared-memory group count on this host (through a process group and any_transport too).

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>

#include "../catch.hpp"
#include "../support/thread_ranks.hpp"
#include "dtrain/transport/any.hpp"
#include "dtrain/transport/group.hpp"
#include "dtrain/transport/mixed.hpp"
#include "dtrain/transport/shm.hpp"
#include "dtrain/transport/tcp.hpp"
#include "tcp_ranks.hpp"  // token

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

// Lets the calling thread (a rank's, so no Catch2 assertion here) run on two of its cores only
// (where it has two), so that the rule's answer depends on the ranks counted whatever the host:
// one rank spins, two do not. @returns the cores it kept, after checking that `usable_cores`
// sees the same.
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
  if (detail::usable_cores() != static_cast<unsigned>(kept)) throw std::runtime_error("usable_cores ignores affinity");
  return static_cast<unsigned>(kept);
}

// The rule's answer for `n` ranks on `cores`, checked against its closed form where the thread
// has two cores (every host with two): only one rank spins.
bool expected_spare(int n, unsigned cores) {
  const bool spare = detail::spare_cores_for(n, cores);
  if (cores == 2 && spare != (n == 1)) throw std::runtime_error("two cores, but not the rule's answer");
  return spare;
}

sockaddr_storage address(const char* text) {
  sockaddr_storage a{};
  if (std::string_view(text).find(':') == std::string_view::npos) {
    auto& v4 = reinterpret_cast<sockaddr_in&>(a);
    v4.sin_family = AF_INET;
    REQUIRE(::inet_pton(AF_INET, text, &v4.sin_addr) == 1);
  } else {
    auto& v6 = reinterpret_cast<sockaddr_in6&>(a);
    v6.sin6_family = AF_INET6;
    REQUIRE(::inet_pton(AF_INET6, text, &v6.sin6_addr) == 1);
  }
  return a;
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

TEST_CASE("progress: the transports wait with default_progress, and two addresses are one host's alike",
          "[progress]") {
  static_assert(std::is_same_v<tcp_transport, basic_tcp_transport<default_progress>>);
  static_assert(std::is_same_v<shm_transport, basic_shm_transport<default_progress>>);
  static_assert(std::is_same_v<mixed_transport, basic_mixed_transport<default_progress>>);
  using detail::tcp_engine::same_host;
  CHECK(same_host(address("10.0.0.1"), address("10.0.0.1")));
  CHECK_FALSE(same_host(address("10.0.0.1"), address("10.0.0.2")));
  CHECK(same_host(address("127.0.0.1"), address("127.0.0.5")));
  CHECK_FALSE(same_host(address("127.0.0.1"), address("10.0.0.1")));
  CHECK(same_host(address("fd00::1"), address("fd00::1")));
  CHECK_FALSE(same_host(address("fd00::1"), address("fd00::2")));
  CHECK(same_host(address("::1"), address("::1")));
  CHECK_FALSE(same_host(address("10.0.0.1"), address("::ffff:10.0.0.2")));
}

TEST_CASE("progress: a TCP group counts its ranks on this host by its connections' addresses", "[progress][tcp]") {
  // Every rank connects over loopback, so all of them are here; each rank's thread runs on two
  // cores (where it has two): one rank alone spins, two or three do not. A process group over
  // the transport answers as it does.
  tcp_options o;
  o.token = tcp_case::token;
  o.timeout = 20s;
  for (int n : {1, 2, 3}) {
    INFO(n << " ranks");
    auto connect = [&](tcp_store& store, int r) {
      const bool want = expected_spare(n, two_cores_only());
      auto t = tcp_transport::connect(store, r, n, o, "127.0.0.1");
      if (t.spare_cores() != want) throw std::runtime_error("a TCP group miscounted its ranks here");
      process_group<tcp_transport> world(std::move(t));
      if (world.spare_cores() != want) throw std::runtime_error("a process group answers otherwise");
      return world;
    };
    testing::run_thread_ranks(n, tcp_case::token, connect, [](int, process_group<tcp_transport>&) {});
  }
}

TEST_CASE("progress: a shared-memory group's ranks are all on this host", "[progress][shm]") {
  shm_options o;
  o.token = tcp_case::token;
  o.ring_bytes = 4096;
  for (int n : {1, 2, 3}) {
    INFO(n << " ranks");
    auto connect = [&](tcp_store& store, int r) {
      const bool want = expected_spare(n, two_cores_only());
      auto t = shm_transport::connect(store, r, n, o);
      if (t.spare_cores() != want) throw std::runtime_error("a shared-memory group miscounted its ranks");
      any_transport any(std::move(t));
      if (any.spare_cores() != want) throw std::runtime_error("any_transport answers otherwise");
      return any;
    };
    testing::run_thread_ranks(n, tcp_case::token, connect, [](int, any_transport&) {});
  }
}
