// Forming a tcp_transport group with real sockets on loopback, ranks as threads of this process:
// a rank that never shows up named in the timeout, a wrong token refused at the handshake, a group
// rebuilt in a new epoch, a late rank joining a running group, a second process for one rank.

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "../catch.hpp"
#include "../support/thread_checks.hpp"
#include "../support/thread_ranks.hpp"
#include "dtrain/transport/group.hpp"
#include "dtrain/transport/tcp.hpp"
#include "tcp_ranks.hpp"

using namespace dtrain;
using namespace dtrain::tcp_case;
using namespace std::chrono_literals;

namespace {

// Ranks 0..joining-1 of a group of `size` try to form it, each with options from `options_of`;
// returns what each one's attempt threw (empty if it formed).
template <class OptionsOf>
std::vector<std::string> try_forming(int joining, int size, OptionsOf options_of, int first = 0) {
  tcp_store_server server("127.0.0.1", 0, token);
  std::vector<std::string> errors(static_cast<std::size_t>(joining));
  std::vector<std::thread> ts;
  for (int r = first; r < first + joining; ++r) {
    ts.push_back(testing::thread_keeping_error(errors[static_cast<std::size_t>(r - first)], [&, r] {
      tcp_store store("127.0.0.1", server.port(), deadline::after(5s), token);
      tcp_transport::connect(store, r, size, options_of(r), "127.0.0.1");
    }));
  }
  for (auto& t : ts) t.join();
  return errors;
}

}  // namespace


TEST_CASE("tcp: a rank that never shows up is named in the timeout", "[tcp]") {
  auto errors = try_forming(2, 3, [](int) {  // ranks 0 and 1 of a group of 3
    auto o = test_options();
    o.timeout = 1500ms;
    return o;
  });
  INFO(errors[0]);
  TCHECK(errors[0].find("rank(s) 2") != std::string::npos);
  TCHECK(errors[1].find("rank(s) 2") != std::string::npos);
  // Without rank 0, the others wait for its address in the store, and name it there.
  errors = try_forming(2, 3, [](int) {  // ranks 1 and 2 of a group of 3
    auto o = test_options();
    o.timeout = 1500ms;
    return o;
  }, 1);
  INFO(errors[0]);
  for (const auto& e : errors) TCHECK(e.find("rank 0 did not join the group before the deadline") != std::string::npos);
}

// "No time limit" spelled as the duration's max: the deadline saturates, and nothing derived from it
// (a connect attempt's 50 ms of slack, the store's wait) may wrap into the past and fail at once.
TEST_CASE("tcp: a group with milliseconds::max() as its timeout forms and moves messages", "[tcp]") {
  auto o = test_options();
  o.timeout = std::chrono::milliseconds::max();
  run_tcp(3, [](int r, tcp_transport& t) {
    std::vector<int> out{r, r + 10}, in(2, -1);
    const int next = (r + 1) % 3, prev = (r + 2) % 3;
    auto rx = t.irecv(prev, 5, testing::bytes_of(in));
    auto tx = t.isend(next, 5, signature{}, testing::bytes_of(out));
    tx.wait(deadline::after(20s));
    rx.wait(deadline::after(20s));
    TCHECK(in == std::vector<int>{prev, prev + 10});
  }, o);
}

TEST_CASE("tcp: a peer with another token is refused at the handshake", "[tcp]") {
  auto errors = try_forming(2, 2, [](int r) {
    auto o = test_options();
    o.timeout = 2s;
    if (r == 1) o.token = "not-the-token";
    return o;
  });
  INFO(errors[1]);
  TCHECK(errors[1].find("token") != std::string::npos);
  TCHECK(errors[0].find("rank(s) 1") != std::string::npos);  // rank 0 never admitted it
}

TEST_CASE("tcp: a group is rebuilt in a new epoch without restarting, through the same store", "[tcp]") {
  tcp_store_server server("127.0.0.1", 0, token);
  std::atomic<int> wrong{0};
  std::vector<std::thread> ts;
  for (int r = 0; r < 3; ++r) {
    ts.emplace_back([&, r] {
      tcp_store store("127.0.0.1", server.port(), deadline::after(10s), token);
      for (std::uint64_t epoch = 0; epoch < 3; ++epoch) {
        auto o = test_options();
        o.epoch = epoch;
        communicator<tcp_transport> c(tcp_transport::connect(store, r, 3, o, "127.0.0.1"));
        std::vector<int> v(1000, r + static_cast<int>(epoch));
        c.allreduce(std::span(v), reduce_op::sum);
        for (int x : v) wrong += x != 3 + 3 * static_cast<int>(epoch) ? 1 : 0;
      }
    });
  }
  for (auto& t : ts) t.join();
  CHECK(wrong.load() == 0);
}

TEST_CASE("tcp: a late rank joins a running group, gets what was sent to it meanwhile, and finds a rank gone before it "
          "came lost", "[tcp]") {
  tcp_store_server server("127.0.0.1", 0, token);
  auto o = test_options();
  o.late_ranks = 1;  // rank 3 of 4
  o.abort_group_on_peer_loss = false;
  const std::string early = "sent before rank 3 came", reply = "rank 3 is here";
  std::promise<void> formed_without_it, rank_2_gone;
  std::shared_future<void> formed = formed_without_it.get_future().share(), gone = rank_2_gone.get_future().share();
  std::string received_early, received_reply, lost_text;
  bool early_written = false;
  auto rank = [&](int r) {
    tcp_store store("127.0.0.1", server.port(), deadline::after(10s), token);
    if (r == 3) gone.wait();  // comes once the group has run without it, and rank 2 has left
    auto t = tcp_transport::connect(store, r, 4, o, "127.0.0.1");
    std::vector<std::byte> in;
    if (r == 0) {
      auto sent = t.isend(3, 7, signature{}, std::as_bytes(std::span(early)));
      formed_without_it.set_value();
      sent.wait(deadline::after(10s));  // written once rank 3 connects
      early_written = true;
    } else if (r == 1) {
      t.irecv(3, 8, in).wait(deadline::after(10s));  // posted before rank 3 exists
      received_reply.assign(reinterpret_cast<const char*>(in.data()), in.size());
    } else if (r == 2) {
      formed.wait();  // then leaves: its transport shuts down and its port closes
    } else {
      t.irecv(0, 7, in).wait(deadline::after(10s));
      received_early.assign(reinterpret_cast<const char*>(in.data()), in.size());
      t.isend(1, 8, signature{}, std::as_bytes(std::span(reply))).wait(deadline::after(10s));
      std::error_code ec;
      auto from_2 = t.irecv(2, 9, std::span<std::byte>{});
      from_2.wait(deadline::after(10s), ec);
      lost_text = ec == errc::peer_lost ? from_2.detail() : "receive from rank 2: " + ec.message();
    }
  };
  std::vector<std::string> errors(4);
  std::vector<std::thread> ts;
  for (int r = 0; r < 4; ++r) {
    ts.push_back(testing::thread_keeping_error(errors[static_cast<std::size_t>(r)], [&, r] { rank(r); }));
  }
  ts[2].join();
  rank_2_gone.set_value();
  for (std::size_t i = 0; i < ts.size(); ++i) {
    if (i != 2) ts[i].join();
  }
  for (const auto& e : errors) CHECK(e.empty());
  CHECK(early_written);
  CHECK(received_early == early);
  CHECK(received_reply == reply);
  CHECK_THAT(lost_text, Catch::Contains("rank 2 did not answer rank 3 joining the group late"));
}

TEST_CASE("tcp: a second process for a rank that already joined is refused through the store, naming the rank and "
          "epoch, and the group goes on", "[tcp]") {
  // A group of 3 whose rank 2 is late: a duplicate of rank 1 (a member from the start) and one
  // of rank 2 (which joined late) each try to join the running group.
  tcp_store_server server("127.0.0.1", 0, token);
  auto o = test_options();
  o.epoch = 5;
  o.late_ranks = 1;
  std::promise<void> all_in, duplicates_tried;
  std::shared_future<void> in = all_in.get_future().share(), tried = duplicates_tried.get_future().share();
  std::atomic<int> joined{0};
  std::vector<std::string> received(3);
  auto rank = [&](int r) {
    tcp_store store("127.0.0.1", server.port(), deadline::after(10s), token);
    auto t = tcp_transport::connect(store, r, 3, o, "127.0.0.1");
    if (++joined == 3) all_in.set_value();
    tried.wait();
    // The group still works, and talks to the first processes: each sends its rank to the next.
    const std::string mine = "from rank " + std::to_string(r);
    auto sent = t.isend((r + 1) % 3, 3, signature{}, std::as_bytes(std::span(mine)));
    std::vector<std::byte> got;
    t.irecv((r + 2) % 3, 3, got).wait(deadline::after(10s));
    sent.wait(deadline::after(10s));
    received[static_cast<std::size_t>(r)].assign(reinterpret_cast<const char*>(got.data()), got.size());
  };
  std::vector<std::thread> ts;
  std::vector<std::string> errors(3);
  for (int r = 0; r < 3; ++r) {
    ts.push_back(testing::thread_keeping_error(errors[static_cast<std::size_t>(r)], [&, r] { rank(r); }));
  }
  in.wait();
  tcp_store reader("127.0.0.1", server.port(), deadline::after(10s), token);
  auto address_of = [&](int r) {
    return value_text(reader.get(epoch_key(5, "addr/" + std::to_string(r)), deadline::after(10s)));
  };
  const std::string first_1 = address_of(1), first_2 = address_of(2);
  std::vector<std::string> refused;
  for (int r : {1, 2}) {
    try {
      tcp_store store("127.0.0.1", server.port(), deadline::after(10s), token);
      auto again = o;
      again.timeout = 3s;
      tcp_transport::connect(store, r, 3, again, "127.0.0.1");
      refused.emplace_back("rank " + std::to_string(r) + " was admitted twice");
    } catch (const error& e) {
      CHECK(e.code() == errc::invalid_argument);
      refused.emplace_back(e.what());
    }
  }
  duplicates_tried.set_value();
  for (auto& t : ts) t.join();
  REQUIRE(refused.size() == 2);
  CHECK(address_of(1) == first_1);  // refused before it could publish its own
  CHECK(address_of(2) == first_2);
  CHECK_THAT(refused[0], Catch::Contains("rank 1 already joined the group of epoch 5") && Catch::Contains("(claim 2)"));
  CHECK_THAT(refused[1], Catch::Contains("rank 2 already joined the group of epoch 5"));
  for (const auto& e : errors) CHECK(e.empty());
  for (int r = 0; r < 3; ++r)
    CHECK(received[static_cast<std::size_t>(r)] == "from rank " + std::to_string((r + 2) % 3));
}
