// The collective API beyond even, blocking calls, over the in-process transport: uneven (`v`)
// blocks with empty splits, 8-bit, bool and byte elements, users' operators, nonblocking calls
// waited in any order and calls from two threads, each against a serial reference
// (api_case.hpp, which tcp_worker runs over real sockets). And the arguments each refuses.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <thread>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "../catch.hpp"
#include "api_case.hpp"
#include "dtrain/collective/communicator.hpp"
#include "dtrain/transport/inproc.hpp"
#include "../support/thread_checks.hpp"

using namespace dtrain;

namespace {

// Runs `body(comm)` on every rank of an in-process world of p and sums the wrong results.
template <class Body>
int on_world(int p, Body body, std::size_t segment_bytes = 1 << 20) {
  std::atomic<int> wrong{0};
  run_inproc(p, [&](int, inproc_transport t) {
    communicator_options o;
    o.timeout = std::chrono::seconds(60);
    o.segment_bytes = segment_bytes;
    communicator<inproc_transport> c(std::move(t), o);
    wrong += body(c);
  });
  return wrong.load();
}

}  // namespace

TEST_CASE("v collectives match the packed serial layout, empty splits included", "[collective][api]") {
  for (int p = 1; p <= 7; ++p) {
    for (unsigned seed : {1u, 2u, 3u}) {
      INFO("p " << p << " seed " << seed);
      // 64-byte segments make the ring cut uneven blocks into many segments, some empty.
      CHECK(on_world(p, [&](auto& c) { return api_case::uneven<float>(c, seed, 300); }, 64) == 0);
      CHECK(on_world(p, [&](auto& c) { return api_case::uneven<std::int64_t>(c, seed, 5); }) == 0);
      CHECK(on_world(p, [&](auto& c) { return api_case::uneven<std::byte>(c, seed, 70000); }) == 0);
    }
  }
}

TEST_CASE("uint8, int8 and bool reduce as documented, raw bytes broadcast and gather", "[collective][api]") {
  for (int p : {1, 2, 3, 5, 8}) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{70001}}) {
      INFO("p " << p << " n " << n);
      CHECK(on_world(p, [&](auto& c) { return api_case::small_types(c, n); }, 4096) == 0);
    }
  }
}

TEST_CASE("a user's operator reduces with every algorithm as the serial fold does", "[collective][api]") {
  for (int p : {1, 2, 3, 4, 6, 7}) {
    for (std::size_t n : {std::size_t{1}, std::size_t{33}, std::size_t{5000}}) {
      INFO("p " << p << " n " << n);
      CHECK(on_world(p, [&](auto& c) { return api_case::user_operator(c, n); }, 256) == 0);
    }
  }
}

TEST_CASE("nonblocking collectives complete in any wait order and blocking calls queue behind them",
          "[collective][api]") {
  for (int p : {1, 2, 3, 5}) {
    for (std::size_t n : {std::size_t{1}, std::size_t{777}, std::size_t{100000}}) {
      INFO("p " << p << " n " << n);
      CHECK(on_world(p, [&](auto& c) { return api_case::nonblocking(c, n, static_cast<unsigned>(n)); }) == 0);
    }
  }
}

TEST_CASE("two threads may share a communicator", "[collective][api]") {
  for (int p : {2, 3}) CHECK(on_world(p, [&](auto& c) { return api_case::two_threads(c, 4096, 200); }) == 0);
}

TEST_CASE("a failed nonblocking collective rethrows at wait and later ones fail as broken", "[collective][api]") {
  std::atomic<bool> checked{false};
  run_inproc(2, [&](int r, inproc_transport t) {
    communicator_options o;
    o.timeout = std::chrono::milliseconds(300);
    communicator<inproc_transport> c(std::move(t), o);
    std::vector<float> a(10, 1), b(10, 1);
    if (r == 1) {
      auto first = c.iallreduce<float>(std::span(a), reduce_op::sum);
      auto second = c.iallreduce<float>(std::span(b), reduce_op::sum);
      std::error_code ec;
      try {
        second.wait();
      } catch (const dtrain::error& e) {
        ec = e.code();
      }
      TCHECK(ec == errc::broken);  // queued behind the one that timed out
      TCHECK(first.test());
      std::string what;
      try {
        first.wait();
      } catch (const dtrain::error& e) {
        what = e.what();
      }
      TCHECK(what.find("timed out") != std::string::npos);
      TCHECK(what.find("rank 0") != std::string::npos);
    }
    // Rank 0 never joins (nor leaves, which would fail rank 1 sooner): rank 1's allreduce times
    // out naming it.
    if (r == 1) checked = true;
    while (!checked) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  });
}

TEST_CASE("the new forms refuse bad arguments with invalid_argument", "[collective][api]") {
  run_inproc(3, [&](int r, inproc_transport t) {
    communicator<inproc_transport> c(std::move(t));
    auto refused = [&](auto&& call, const char* text) {
      try {
        call();
      } catch (const dtrain::error& e) {
        return e.code() == errc::invalid_argument && std::string(e.what()).find(text) != std::string::npos;
      }
      return false;
    };
    std::vector<float> buf(6), out(6);
    std::vector<std::size_t> two{1, 2}, three{1, 2, 3};
    TCHECK(refused([&] { c.allgatherv<float>(std::span(buf).first(1), std::span(out), two); }, "one entry per rank"));
    TCHECK(refused(
        [&] {
          c.allgatherv<float>(std::span(buf).first(three[static_cast<std::size_t>(r)] % 3 + 1), std::span(out), three);
        },
        "counts[rank()]"));
    TCHECK(refused(
        [&] {
          c.allgatherv<float>(std::span(buf).subspan(0, three[static_cast<std::size_t>(r)]), std::span(out).first(5),
                              three);
        },
        "sum of the counts (6 elements), not 5"));
    TCHECK(refused([&] { c.alltoallv<float>(std::span(buf), three, std::span(out).first(4), three); },
                   "out must hold the sum"));
    TCHECK(refused([&] { c.reduce_scatterv<float>(std::span(buf).first(5), three, std::span(out), reduce_op::sum); },
                  "in must hold the sum of the counts (6 elements), not 5"));
    TCHECK(refused([&] { c.reduce_scatterv<float>(std::span(buf), three, std::span(out).first(4), reduce_op::sum); },
                  "counts[rank()]"));
    TCHECK(
        refused([&] { c.scatterv<float>(std::span(buf), three, std::span(out).first(1), 3); }, "root is not a rank"));
    auto flags = std::make_unique<bool[]>(4);
    TCHECK(refused([&] { c.allreduce<bool>(std::span(flags.get(), 4), reduce_op::avg); }, "avg of bool"));
    TCHECK(refused([&] { c.allreduce<float>(std::span(buf), reduce_op::custom); }, "set by a user_op"));
    TCHECK(refused([&] { c.allreduce<float>(std::span(buf), reduce_op::bxor); },
                   "bitwise and, or and xor reduce integers and bools"));
    c.barrier();  // nothing above reached the wire: the group is still in step
  });
}

// Raw bytes move but do not reduce: the reducing forms do not accept them.
template <class C>
concept reduces_bytes = requires(C c, std::span<std::byte> b) { c.template allreduce<std::byte>(b, reduce_op::sum); };
static_assert(!reduces_bytes<communicator<inproc_transport>>);
static_assert(element<std::byte> && element<bool> && element<std::uint8_t> && element<std::int8_t> && !element<char>);

// A job's captures are freed once it has run, outside the queue's lock: a capture's destructor
// may wait for a thread that is queueing the next job (a PyTorch tensor freed on the queue's
// thread needs Python's GIL, held by the thread calling submit). Before this held, the torch
// backend deadlocked now and then.
TEST_CASE("call_queue frees a finished job's captures outside its lock", "[collective][api]") {
  struct verdict {
    std::atomic<bool> took_lock{false};  // the other thread got the queue's lock
    std::atomic<bool> in_time{false};    // ... while the capture was being destroyed
  };
  struct lock_probe {
    dtrain::detail::call_queue* queue;
    std::shared_ptr<verdict> seen;
    ~lock_probe() {
      // Another thread takes the queue's lock (busy() does); wait up to 2 s for it to get it.
      std::thread([q = queue, v = seen] {
        (void)q->busy();
        v->took_lock.store(true);
      }).detach();
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
      while (!seen->took_lock.load() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
      seen->in_time.store(seen->took_lock.load());
    }
  };
  auto seen = std::make_shared<verdict>();
  {
    dtrain::detail::call_queue queue;
    auto probe = std::make_shared<lock_probe>(&queue, seen);
    queue.submit([probe = std::move(probe)] {}).wait();  // the job holds the only reference
    queue.stop();
    while (!seen->took_lock.load()) std::this_thread::yield();  // the helper is done with the queue
  }
  CHECK(seen->in_time.load());
}
