// Both stores: set/get/add semantics, waiting with a deadline, atomic add under contention,
// epochs; the TCP store over real sockets with the job token, refusing a wrong one.

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>
#include <unistd.h>

#include "../catch.hpp"
#include "dtrain/rendezvous/file_store.hpp"
#include "dtrain/rendezvous/launch_store.hpp"
#include "dtrain/rendezvous/tcp_store.hpp"
#include "../support/scoped_env.hpp"

using namespace dtrain;
using namespace std::chrono_literals;

namespace {

using dtrain::testing::scoped_env;

template <class MakeStore>
void store_semantics(MakeStore make) {
  auto a = make();
  auto b = make();
  const auto soon = [] { return deadline::after(5s); };

  SECTION("set then get, across clients") {
    a->set("k", as_value("hello"), soon());
    CHECK(value_text(b->get("k", soon())) == "hello");
    a->set("k", as_value("again"), soon());
    CHECK(value_text(b->get("k", soon())) == "again");
  }
  SECTION("get waits for a set from another thread") {
    std::thread setter([&] {
      std::this_thread::sleep_for(100ms);
      a->set("late", as_value("here"), soon());
    });
    auto t0 = std::chrono::steady_clock::now();
    CHECK(value_text(b->get("late", soon())) == "here");
    CHECK(std::chrono::steady_clock::now() - t0 >= 90ms);
    setter.join();
  }
  SECTION("get times out with errc::timeout and a message naming the key") {
    std::error_code ec;
    auto t0 = std::chrono::steady_clock::now();
    b->get("never", deadline::after(200ms), ec);
    CHECK(ec == errc::timeout);
    CHECK(std::chrono::steady_clock::now() - t0 < 3s);
    try {
      b->get("never", deadline::after(50ms));
      FAIL("no exception");
    } catch (const error& e) {
      CHECK(std::string(e.what()).find("'never'") != std::string::npos);
    }
  }
  SECTION("add is atomic across clients and threads") {
    constexpr int threads = 4, each = 50;
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&] {
        auto s = make();
        for (int i = 0; i < each; ++i) s->add("counter", 1, soon());
      });
    }
    for (auto& t : ts) t.join();
    CHECK(a->add("counter", 0, soon()) == threads * each);
    CHECK(a->add("counter", -5, soon()) == threads * each - 5);
  }
  SECTION("keys up to the limit, escaped or not, stay apart and read back whole") {
    const std::string longest(detail::max_store_key, 'k');
    const std::string slashes(300, '/');                     // each byte a file name's three
    const std::string alike = std::string(250, 'p') + "-a";  // past a file name: hashed
    const std::string alike_too = std::string(250, 'p') + "-b";
    a->set(longest, as_value("longest"), soon());
    a->set(slashes, as_value("slashes"), soon());
    a->set(alike, as_value("a"), soon());
    a->set(alike_too, as_value(""), soon());  // empty, under a hashed name
    CHECK(value_text(b->get(longest, soon())) == "longest");
    CHECK(value_text(b->get(slashes, soon())) == "slashes");
    CHECK(value_text(b->get(alike, soon())) == "a");
    CHECK(value_text(b->get(alike_too, soon())).empty());
    CHECK(b->add(alike + "-n", 7, soon()) == 7);
    CHECK(b->add(alike + "-n", 1, soon()) == 8);
  }
  SECTION("what the store keeps beside a value (an add's lock, a value being written) is no key") {
    a->add("counter", 5, soon());
    a->set("value", as_value("v"), soon());
    for (const char* other : {"counter.lock", "l-counter", "value.tmp", "t-value", "v-value"}) {
      std::error_code ec;
      b->get(other, deadline::after(50ms), ec);
      INFO(other);
      CHECK(ec == errc::timeout);
    }
  }
  SECTION("epochs keep keys apart") {
    a->set(epoch_key(0, "addr/0"), as_value("old"), soon());
    a->set(epoch_key(1, "addr/0"), as_value("new"), soon());
    CHECK(value_text(b->get(epoch_key(1, "addr/0"), soon())) == "new");
    CHECK(value_text(b->get(epoch_key(0, "addr/0"), soon())) == "old");
  }
  SECTION("bad keys are refused") {
    std::error_code ec;
    a->set("", as_value("x"), soon(), ec);
    CHECK(ec == errc::invalid_argument);
  }
}

}  // namespace

TEST_CASE("file store: semantics", "[rendezvous]") {
  auto dir = std::filesystem::temp_directory_path() / ("dtrain-store-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  store_semantics([&] { return std::make_unique<file_store>(dir); });
  std::filesystem::remove_all(dir);
}

TEST_CASE("tcp store: semantics over real sockets", "[rendezvous]") {
  tcp_store_server server("127.0.0.1", 0, "secret");
  store_semantics(
      [&] { return std::make_unique<tcp_store>("127.0.0.1", server.port(), deadline::after(5s), "secret"); });
}

TEST_CASE("tcp store: a client with the wrong token is refused, quickly", "[rendezvous]") {
  tcp_store_server server("127.0.0.1", 0, "secret");
  auto t0 = std::chrono::steady_clock::now();
  try {
    tcp_store s("127.0.0.1", server.port(), deadline::after(5s), "guess");
    FAIL("connected with a wrong token");
  } catch (const error& e) {
    CHECK(e.code() == errc::auth_failed);
    CHECK(std::string(e.what()).find("token") != std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
  // The server still serves the right token afterwards.
  tcp_store ok("127.0.0.1", server.port(), deadline::after(5s), "secret");
  ok.set("x", as_value("1"), deadline::after(5s));
}

TEST_CASE("tcp store: a client retries until the server is up", "[rendezvous]") {
  // Find a free port, then start the server on it only after the client began trying.
  std::uint16_t port;
  { tcp_store_server probe("127.0.0.1", 0, "s"); port = probe.port(); }
  std::unique_ptr<tcp_store_server> server;
  std::thread later([&] {
    std::this_thread::sleep_for(300ms);
    server = std::make_unique<tcp_store_server>("127.0.0.1", port, "s");
  });
  tcp_store client("127.0.0.1", port, deadline::after(5s), "s");
  later.join();
  client.set("k", as_value("v"), deadline::after(5s));
  CHECK(value_text(client.get("k", deadline::after(5s))) == "v");
}

TEST_CASE("tcp store: no server means a timeout naming the address", "[rendezvous]") {
  std::uint16_t port;
  { tcp_store_server probe("127.0.0.1", 0, "s"); port = probe.port(); }
  try {
    tcp_store client("127.0.0.1", port, deadline::after(300ms), "s");
    FAIL("connected to nothing");
  } catch (const error& e) {
    CHECK(e.code() == errc::timeout);
    CHECK(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)) != std::string::npos);
    // What the attempts met, not the last one's cut-off by the deadline.
    CHECK(std::string(e.what()).find("last error: Connection refused") != std::string::npos);
  }
}

TEST_CASE("launch store: a rank that cannot reach rank 0's store says where to look", "[rendezvous]") {
  std::uint16_t port;
  { tcp_store_server probe("127.0.0.1", 0, "s"); port = probe.port(); }
  // Rank 1 of a torchrun-style job whose rank 0 never came (or listens on another port).
  const std::string port_text = std::to_string(port);
  std::string what;
  {
    const scoped_env env(
        {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port_text}});
    try {
      with_launch_store(300ms, "s", "", [](const std::string& h) { return h; },
                        [](auto&, const launch_environment&) { return 0; });
    } catch (const error& e) {
      CHECK(e.code() == errc::timeout);
      what = e.what();
    }
  }
  INFO(what);
  CHECK(what.find("cannot reach the rendezvous store at 127.0.0.1:" + port_text) != std::string::npos);
  CHECK(what.find("last error: Connection refused") != std::string::npos);
  CHECK(what.find("rank 0 serves it: is rank 0 running, and do all ranks name the same address and port") !=
        std::string::npos);
}
