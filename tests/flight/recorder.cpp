// The flight recorder's ring and its dump format: what communicators and point-to-point messages
// record is checked against the calls the test itself made. The analysis of dumps is in
// analysis.cpp; the real-process cases are tools/flight_recorder.sh's.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "../catch.hpp"
#include "../../tools/flight_analysis.hpp"
#include "dtrain/collective/communicator.hpp"
#include "dtrain/flight/dump.hpp"
#include "dtrain/flight/recorded.hpp"
#include "dtrain/transport/group.hpp"
#include "dtrain/transport/inproc.hpp"

using namespace dtrain;
namespace analysis = dtrain_tools::flight;

namespace {

signature call_of(coll_op op, std::uint64_t seq, std::uint64_t count, int root = 0) {
  return signature{op, algorithm::ring, dtype::float32, reduce_op::sum, root, count, seq};
}

std::vector<flight::call> calls_of(const flight::recorder& r) {
  std::vector<flight::call> out;
  r.for_each([&](const flight::call& c) { out.push_back(c); });
  return out;
}

// The calls of the global recorder with `count` elements (this test's own, among the others').
std::vector<analysis::call_record> recorded_with_count(std::uint64_t count, std::vector<int> ranks) {
  const auto path = std::filesystem::temp_directory_path() / ("dtrain_flight_test." + std::to_string(::getpid()));
  REQUIRE(flight::dump("test", path.string()) == path.string());
  analysis::dump d;
  std::string problem;
  REQUIRE(analysis::read_dump(path, d, problem));
  std::filesystem::remove(path);
  CHECK(d.reason == "test");
  std::vector<analysis::call_record> out;
  for (auto& c : d.calls) {
    if (c.count == count && std::find(ranks.begin(), ranks.end(), c.rank) != ranks.end()) out.push_back(c);
  }
  return out;
}

}  // namespace

TEST_CASE("flight: the ring keeps the last calls, oldest first, and a handle on an overwritten slot writes nothing",
          "[flight]") {
  flight::recorder r(4);
  const flight::recorder::group_info g{"world", 0, 2, 0, 7};
  std::vector<flight::recorder::handle> handles;
  for (std::uint64_t seq = 0; seq < 6; ++seq) handles.push_back(r.start(g, call_of(coll_op::allreduce, seq, 10 + seq)));
  handles[5].waiting(1, true);
  handles[1].failed("stale");  // call 1's slot now holds call 5
  handles[3].completed();
  const auto calls = calls_of(r);
  REQUIRE(calls.size() == 4);
  CHECK(r.recorded() == 6);
  for (std::size_t i = 0; i < calls.size(); ++i) {
    CHECK(calls[i].id == i + 3);
    CHECK(calls[i].sig.seq == i + 2);
    CHECK(calls[i].sig.count == 12 + i);
    CHECK(calls[i].tag == 7);
  }
  CHECK(calls[3].where == flight::state::waiting);
  CHECK(calls[3].peer == 1);
  CHECK(calls[3].sending);
  CHECK(std::string(calls[3].note).empty());
  CHECK(calls[1].where == flight::state::completed);
  CHECK(calls[1].end_us >= calls[1].start_us);
  CHECK(calls[0].where == flight::state::started);
  CHECK(calls[0].end_us == 0);
}

TEST_CASE("flight: a recorder of size 0 records nothing", "[flight]") {
  flight::recorder r(0);
  CHECK_FALSE(r.enabled());
  const auto h = r.start({"world", 0, 1, 0, 0}, call_of(coll_op::barrier, 0, 0));
  h.completed();
  CHECK(calls_of(r).empty());
}

TEST_CASE("flight: the dump writes numbers and text as they are, each call on one line", "[flight]") {
  flight::recorder r(2);
  const char* note = flight::recorder::intern("line one\nline two");
  const std::int64_t before = flight::recorder::now_us();
  constexpr auto most = std::numeric_limits<std::uint64_t>::max();
  const auto h = r.start({flight::recorder::intern("my group"), 1, 7, 5, most, 3},
                         call_of(coll_op::broadcast, most - 1, 123456789012345, 1));
  h.waiting(4, true);
  h.failed(note);
  const auto path = std::filesystem::temp_directory_path() / ("dtrain_flight_format." + std::to_string(::getpid()));
  {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(fd >= 0);
    flight::detail::signal_safe_writer w(fd);
    flight::detail::write_dump(w, r, -3, "why\nnot", "first");
    w << std::numeric_limits<std::int64_t>::min() << '\n';
    REQUIRE(w.flush());
    ::close(fd);
  }
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  REQUIRE(lines.size() == 10);  // 8 header lines, the call, the number
  CHECK(lines.back() == std::to_string(std::numeric_limits<std::int64_t>::min()));
  analysis::dump d;
  std::string problem;
  REQUIRE(analysis::read_dump(path, d, problem));  // the last line is no key of a dump: ignored
  std::filesystem::remove(path);
  CHECK(d.rank == -3);
  CHECK(d.pid == static_cast<long>(::getpid()));
  CHECK(d.reason == "why not");
  CHECK(d.first == "first");
  CHECK(d.dumped_us >= before);
  REQUIRE(d.calls.size() == 1);
  const auto& c = d.calls[0];
  CHECK(c.group == "my_group");
  CHECK(c.rank == 5);
  CHECK(c.group_rank == 1);
  CHECK(c.group_size == 7);
  CHECK(c.generation == 3);
  CHECK(c.peer == 4);
  CHECK(c.dir == "send");
  CHECK(c.start_us >= before);
  CHECK(c.end_us >= c.start_us);
  CHECK(c.end_us <= d.dumped_us);
  CHECK(c.tag == std::numeric_limits<std::uint64_t>::max());
  CHECK(c.seq == std::numeric_limits<std::uint64_t>::max() - 1);
  CHECK(c.count == 123456789012345);
  CHECK(c.op == "broadcast");
  CHECK(c.root == 1);
  CHECK(c.state == "failed");
  CHECK(c.note == "line one line two");
}

TEST_CASE("flight: communicators record each call as made, and whom a waiting call waits on", "[flight]") {
  constexpr std::uint64_t n = 4321;  // this test's calls, among those of others in the binary
  auto ranks = make_inproc_group(3);
  std::atomic<bool> rank2_seen_waiting{false};
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      communicator<inproc_transport> comm(std::move(ranks[r]));
      std::vector<float> x(n, 1.0f);
      comm.allreduce(std::span(x), reduce_op::sum);
      comm.broadcast(std::span(x), 2);
      if (r == 2) {  // late on purpose: the others must be seen waiting in call 2
        for (int i = 0; i < 2000 && !rank2_seen_waiting; ++i) {
          flight::recorder::global().for_each([&](const flight::call& c) {
            if (c.sig.count == n && c.sig.seq == 2 && c.rank == 0 && c.where == flight::state::waiting) {
              rank2_seen_waiting = true;
            }
          });
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      }
      comm.allreduce(std::span(x), reduce_op::max);
    });
  }
  for (auto& t : threads) t.join();
  CHECK(rank2_seen_waiting);
  const auto calls = recorded_with_count(n, {0, 1, 2});
  REQUIRE(calls.size() == 9);
  for (int r = 0; r < 3; ++r) {
    std::vector<analysis::call_record> mine;
    for (const auto& c : calls) {
      if (c.rank == r) mine.push_back(c);
    }
    REQUIRE(mine.size() == 3);
    CHECK(mine[0].op == "allreduce");
    CHECK(mine[1].op == "broadcast");
    CHECK(mine[1].root == 2);
    CHECK(mine[2].redop == "max");
    for (std::size_t i = 0; i < 3; ++i) {
      CHECK(mine[i].seq == i);
      CHECK(mine[i].state == "completed");
      CHECK(mine[i].group == "world");
      CHECK(mine[i].group_size == 3);
      CHECK(mine[i].dtype == "float32");
    }
  }
}

TEST_CASE("flight: a call that times out is recorded failed, with the peer it waited for", "[flight]") {
  constexpr std::uint64_t n = 3217;
  auto ranks = make_inproc_group(2);
  communicator_options o;
  o.timeout = std::chrono::milliseconds(100);
  communicator<inproc_transport> comm(std::move(ranks[0]), o);
  std::vector<float> x(n, 1.0f);
  CHECK_THROWS_AS(comm.allreduce(std::span(x), reduce_op::sum), dtrain::error);
  const auto calls = recorded_with_count(n, {0});
  REQUIRE(calls.size() == 1);
  CHECK(calls[0].state == "failed");
  CHECK(calls[0].peer == 1);
  CHECK(calls[0].note.find("timed out") != std::string::npos);
}

TEST_CASE("flight: a call in a process group records its group and the world rank it waits on", "[flight]") {
  // World ranks 2 and 0 form "pair" in that order: group rank 0 is world rank 2. World rank 0
  // must be seen waiting on world rank 2 (its group rank 0), not on "rank 0".
  constexpr std::uint64_t n = 2741;
  std::atomic<bool> seen{false};
  std::atomic<int> done{0};
  run_inproc(3, [&](int r, inproc_transport t) {
    process_group<inproc_transport> world(std::move(t));
    if (r == 1) {  // stays till the pair is done: a rank leaving fails the others' calls
      while (done < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return;
    }
    communicator<process_group<inproc_transport>> pair(*world.form(rank_list({2, 0}), "pair"));
    std::vector<float> x(n, 1.0f);
    if (r == 2) {
      for (int i = 0; i < 2000 && !seen; ++i) {
        flight::recorder::global().for_each([&](const flight::call& c) {
          if (c.sig.count == n && c.rank == 0 && c.where == flight::state::waiting && c.peer == 2) seen = true;
        });
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    pair.allreduce(std::span(x), reduce_op::sum);
    ++done;
  });
  CHECK(seen);
  const auto calls = recorded_with_count(n, {0, 2});
  REQUIRE(calls.size() == 2);
  for (const auto& c : calls) {
    CHECK(c.group == "pair");
    CHECK(c.group_rank == (c.rank == 2 ? 0 : 1));
    CHECK(c.tag != communicator_options{}.tag);  // the group's key is in it
    CHECK(c.state == "completed");
  }
  CHECK(calls[0].tag == calls[1].tag);
}

TEST_CASE("flight: a message records its peer, tag, direction and count from the start, numbered per tag",
          "[flight][p2p]") {
  constexpr std::uint64_t tag = 0x5eed'0001;
  auto ranks = make_inproc_group(2);
  flight::p2p_log log0(flight::group_of(ranks[0], 0)), log1(flight::group_of(ranks[1], 0));
  std::vector<float> out(11, 2.0f), in(11, 0.0f);
  signature sig;
  sig.count = 11;
  auto theirs = [&](int rank) {
    std::vector<flight::call> mine;
    flight::recorder::global().for_each([&](const flight::call& c) {
      if (c.sig.op == coll_op::message && c.tag == tag && c.rank == rank) mine.push_back(c);
    });
    return mine;
  };
  // Posted first: started, with its peer; waited for too short: waiting still, not failed.
  auto rx = log1.post(ranks[1].irecv(0, tag, std::as_writable_bytes(std::span(in))), 0, tag, false, sig);
  auto r1 = theirs(1);
  REQUIRE(r1.size() == 1);
  CHECK(r1[0].where == flight::state::started);
  CHECK(r1[0].peer == 0);
  std::error_code ec;
  CHECK_FALSE(rx.wait(deadline::after(std::chrono::milliseconds(20)), ec));
  CHECK(ec == errc::timeout);
  r1 = theirs(1);
  REQUIRE(r1.size() == 1);
  CHECK(r1[0].where == flight::state::waiting);
  CHECK(r1[0].peer == 0);
  CHECK_FALSE(r1[0].sending);
  CHECK(r1[0].sig.seq == 1);
  CHECK(r1[0].sig.count == 11);
  auto tx = log0.post(ranks[0].isend(1, tag, sig, std::as_bytes(std::span(out))), 1, tag, true, sig);
  rx.wait(deadline::after(std::chrono::seconds(5)));
  tx.wait(deadline::after(std::chrono::seconds(5)));
  CHECK(in == out);
  r1 = theirs(1);
  auto r0 = theirs(0);
  REQUIRE(r1.size() == 1);
  REQUIRE(r0.size() == 1);
  CHECK(r1[0].where == flight::state::completed);
  CHECK(r0[0].where == flight::state::completed);
  CHECK(r0[0].peer == 1);
  CHECK(r0[0].sending);
  // The next message on the tag is the second; a receive cancelled before it matched is
  // withdrawn and gives its number to the next; one waited for in vain and then given up stays
  // waiting.
  auto again = log1.post(ranks[1].irecv(0, tag, std::as_writable_bytes(std::span(in))), 0, tag, false, sig);
  again.cancel();
  {
    auto vain = log1.post(ranks[1].irecv(0, tag, std::as_writable_bytes(std::span(in))), 0, tag, false, sig);
    CHECK_THROWS_AS(vain.wait(deadline::after(std::chrono::milliseconds(20))), dtrain::error);
  }
  r1 = theirs(1);
  REQUIRE(r1.size() == 3);
  CHECK(r1[1].sig.seq == 2);
  CHECK(r1[1].where == flight::state::withdrawn);
  CHECK(r1[2].sig.seq == 2);
  CHECK(r1[2].where == flight::state::waiting);
  CHECK(r0[0].sig.seq == 1);
  CHECK(r0[0].sig.count == 11);
}

TEST_CASE("flight: a message withdrawn before it matched gives its number to the channel's later messages",
          "[flight][p2p]") {
  // Rank 1 posts receives 1..5 from rank 0 and withdraws the second and the fourth; rank 0 then
  // sends three messages, which meet receives 1, 3 and 5: those record the numbers 1, 2 and 3 of
  // the sends they met, and the next receive posted is 4. A receive on another tag keeps its
  // number.
  constexpr std::uint64_t tag = 0x5eed'0003, other = 0x5eed'0004;
  auto ranks = make_inproc_group(2);
  flight::p2p_log log0(flight::group_of(ranks[0], 0)), log1(flight::group_of(ranks[1], 0));
  std::vector<std::vector<float>> sent{std::vector<float>(4, 1.0f), std::vector<float>(4, 2.0f),
                                       std::vector<float>(4, 3.0f)};
  std::vector<std::vector<float>> got(6, std::vector<float>(4, 0.0f));
  signature sig;
  sig.count = 4;
  auto receive = [&](std::vector<float>& into, std::uint64_t t) {
    return log1.post(ranks[1].irecv(0, t, std::as_writable_bytes(std::span(into))), 0, t, false, sig);
  };
  std::vector<flight::recorded<inproc_transport::request>> rx;
  for (std::size_t i = 0; i < 5; ++i) rx.push_back(receive(got[i], tag));
  auto elsewhere = receive(got[5], other);
  rx[1].cancel();
  rx[3].cancel();
  for (const auto& what : sent) {
    auto tx = log0.post(ranks[0].isend(1, tag, sig, std::as_bytes(std::span(what))), 1, tag, true, sig);
    tx.wait(deadline::after(std::chrono::seconds(5)));
  }
  for (std::size_t i : {0u, 2u, 4u}) rx[i].wait(deadline::after(std::chrono::seconds(5)));
  CHECK(got[0] == sent[0]);
  CHECK(got[2] == sent[1]);
  CHECK(got[4] == sent[2]);
  CHECK(got[1] == std::vector<float>(4, 0.0f));
  CHECK(got[3] == std::vector<float>(4, 0.0f));
  auto next = receive(got[1], tag);
  using entry = std::pair<std::uint64_t, flight::state>;
  std::map<std::uint64_t, entry> mine;  // record id -> (k, state): rank 1's, in posting order
  std::map<std::uint64_t, flight::state> theirs;  // k -> state: rank 0's sends
  flight::recorder::global().for_each([&](const flight::call& x) {
    if (x.sig.op != coll_op::message || (x.tag != tag && x.tag != other)) return;
    if (x.rank == 1) mine[x.id] = {x.sig.seq, x.where};
    if (x.rank == 0) theirs[x.sig.seq] = x.where;
  });
  using flight::state;
  std::vector<entry> order;
  for (const auto& [id, e] : mine) order.push_back(e);
  // A withdrawn record keeps the number it had when it was withdrawn (the fourth had moved to 3).
  CHECK(order == std::vector<entry>{{1, state::completed}, {2, state::withdrawn}, {2, state::completed},
                                    {3, state::withdrawn}, {3, state::completed}, {1, state::started},
                                    {4, state::started}});
  CHECK(theirs == std::map<std::uint64_t, state>{{1, state::completed}, {2, state::completed}, {3, state::completed}});
  next.cancel();
  elsewhere.cancel();
}

namespace {

// A receive whose group failed: its wait reports `errc::cancelled`, as a transport's does when
// its group fails or stops, though nobody withdrew it.
struct failed_by_its_group {
  bool wait(deadline, std::error_code& ec) noexcept {
    ec = make_error_code(errc::cancelled);
    return false;
  }
  void wait(deadline) { throw error(errc::cancelled, "dtrain: the group failed"); }
  bool test() noexcept { return true; }
  void cancel() noexcept {}
  const envelope& info() const noexcept { return env; }
  envelope env;
};

}  // namespace

TEST_CASE("flight: a message its failed group cancelled is failed, and keeps its number", "[flight][p2p]") {
  // Two receives on a channel; the group fails under the first (its wait says cancelled): it is
  // recorded failed, and the second keeps number 2. Then the same through the throwing wait.
  constexpr std::uint64_t tag = 0x5eed'0005;
  auto ranks = make_inproc_group(2);
  flight::p2p_log log(flight::group_of(ranks[1], 0));
  signature sig;
  sig.count = 3;
  std::vector<float> in(3);
  auto first = log.post(failed_by_its_group{}, 0, tag, false, sig);
  auto second = log.post(ranks[1].irecv(0, tag, std::as_writable_bytes(std::span(in))), 0, tag, false, sig);
  std::error_code ec;
  CHECK_FALSE(first.wait(deadline::after(std::chrono::seconds(1)), ec));
  auto third = log.post(failed_by_its_group{}, 0, tag, false, sig);
  CHECK_THROWS_AS(third.wait(deadline::after(std::chrono::seconds(1))), dtrain::error);
  std::vector<std::pair<std::uint64_t, flight::state>> seen;
  flight::recorder::global().for_each([&](const flight::call& x) {
    if (x.sig.op == coll_op::message && x.tag == tag) seen.push_back({x.sig.seq, x.where});
  });
  using flight::state;
  CHECK(seen == std::vector<std::pair<std::uint64_t, state>>{{1, state::failed}, {2, state::started},
                                                             {3, state::failed}});
  second.cancel();
}

TEST_CASE("flight: messages are numbered apart per peer, tag and direction", "[flight][p2p]") {
  // Rank 0 of three, alone: sends to rank 1 on two tags and to rank 2, and receives from rank 1
  // on the first tag; each key counts from 1 (what pairs the k-th send with the k-th receive).
  auto ranks = make_inproc_group(3);
  flight::p2p_log log(flight::group_of(ranks[0], 0));
  std::vector<float> out(5, 1.0f), in(5);
  signature sig;
  sig.count = 5;
  constexpr std::uint64_t a = 0x5eed'00a0, b = 0x5eed'00b0;
  std::vector<flight::recorded<inproc_transport::request>> posted;
  auto send = [&](int peer, std::uint64_t tag) {
    posted.push_back(log.post(ranks[0].isend(peer, tag, sig, std::as_bytes(std::span(out))), peer, tag, true, sig));
  };
  send(1, a), send(1, a), send(1, b), send(2, a);
  posted.push_back(log.post(ranks[0].irecv(1, a, std::as_writable_bytes(std::span(in))), 1, a, false, sig));
  send(1, a);
  std::vector<std::tuple<int, bool, std::uint64_t, std::uint64_t>> seen;  // (peer, send, tag, k)
  flight::recorder::global().for_each([&](const flight::call& c) {
    if (c.sig.op != coll_op::message || (c.tag != a && c.tag != b)) return;
    seen.push_back({c.peer, c.sending, c.tag, c.sig.seq});
  });
  using m = std::tuple<int, bool, std::uint64_t, std::uint64_t>;
  CHECK(seen == std::vector<m>{{1, true, a, 1}, {1, true, a, 2}, {1, true, b, 1}, {2, true, a, 1}, {1, false, a, 1},
                               {1, true, a, 3}});
  for (auto& r : posted) r.cancel();
}
