// shm_transport with real shared-memory segments, ranks as threads of this process (the
// multi-process tests run tcp_worker with DTRAIN_TEST_TRANSPORT=shm): matching and ordering,
// messages many times a ring's size either way round, truncation, self-sends, graceful leave,
// names gone from /dev/shm once formed, a foreign token refused, a corrupt ring refused, and
// collectives of every size 1..9 against the serial reference.

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <numeric>
#include <set>
#include <thread>

#include "../catch.hpp"
#include "../support/shm_segments.hpp"
#include "../support/thread_checks.hpp"
#include "../support/thread_ranks.hpp"
#include "dtrain/collective/communicator.hpp"
#include "dtrain/transport/shm.hpp"
#include "parts_case.hpp"

using namespace dtrain;
using namespace std::chrono_literals;

static_assert(transport<shm_transport>);

namespace {

const std::string token = "test-token";

// Rings of 64 KiB, so messages of a few MiB cross one many times; with `single_copy` 0 every
// message goes through the rings, else those from that size are read from the sender's memory.
shm_options small_rings(std::size_t single_copy = std::size_t{64} << 10) {
  shm_options o;
  o.single_copy_bytes = single_copy;
  o.token = token;
  o.timeout = 20s;
  o.linger = 5s;
  o.ring_bytes = 64 << 10;
  return o;
}

// Both data paths: the rings alone, and single copies from 64 KiB.
constexpr std::size_t both_paths[] = {0, std::size_t{64} << 10};

// Runs body(rank, transport) on `n` threads, each a rank with its own segments; rethrows the first failure.
template <class Transport = shm_transport, class Body>
void run_shm(int n, Body body, shm_options o = small_rings()) {
  auto connect = [&](tcp_store& store, int r) { return Transport::connect(store, r, n, o); };
  testing::run_thread_ranks(n, token, connect, body);
}

using testing::bytes_of;
using testing::sig_for;

}  // namespace

TEST_CASE("shm: messages of 1 B to 4 MiB arrive in order and intact whichever side comes first", "[shm]") {
  for (std::size_t single_copy : both_paths) {
    INFO("single copy from " << single_copy << " bytes");
    run_shm(2, [](int r, shm_transport& t) {
      const std::size_t sizes[] = {1, 100, 16381, 65536, 65537, 1 << 20, (4 << 20) + 3};
      if (r == 0) {
        std::vector<std::vector<int>> out;
        std::vector<shm_request> sends;
        for (std::size_t i = 0; i < std::size(sizes); ++i) {
          out.emplace_back(sizes[i] / sizeof(int) + 1);
          std::iota(out.back().begin(), out.back().end(), static_cast<int>(i * 1000));
        }
        for (std::size_t i = 0; i < out.size(); ++i) sends.push_back(t.isend(1, 7, sig_for(i), bytes_of(out[i])));
        for (auto& s : sends) s.wait(deadline::after(10s));
      } else {
        for (std::size_t i = 0; i < std::size(sizes); ++i) {
          if (i == 3) std::this_thread::sleep_for(50ms);  // the later ones arrive before their receives
          std::vector<int> in(sizes[i] / sizeof(int) + 1, -1);
          auto req = t.irecv(0, 7, bytes_of(in));
          req.wait(deadline::after(10s));
          TCHECK(req.info().peer == 0);
          TCHECK(req.info().sig.count == i);
          TCHECK(req.info().bytes == in.size() * sizeof(int));
          std::vector<int> want(in.size());
          std::iota(want.begin(), want.end(), static_cast<int>(i * 1000));
          TCHECK(in == want);
        }
      }
    }, small_rings(single_copy));
  }
}

TEST_CASE("shm: gathered sends and scattered receives of every fit whichever side comes first", "[shm]") {
  for (std::size_t single_copy : both_paths) {
    parts_case::tally tally;
    run_shm(2, [&](int r, shm_transport& t) { parts_case::run(r, t, tally.checker()); }, small_rings(single_copy));
    for (const auto& what : tally.failed) FAIL_CHECK(what);
    CHECK(tally.checks == parts_case::expected_checks);
  }
}

TEST_CASE("shm: any_peer and tags and self-sends and resizing receives and truncation", "[shm]") {
  for (std::size_t single_copy : both_paths) {
    INFO("single copy from " << single_copy << " bytes");
    run_shm(3, [](int r, shm_transport& t) {
      std::vector<int> mine(100, r), back(100, -1);
      auto self = t.isend(r, 99, sig_for(1), bytes_of(mine));
      t.irecv(r, 99, bytes_of(back)).wait(deadline::after(5s));
      self.wait(deadline::after(5s));
      TCHECK(back == mine);
      if (r == 0) {
        std::set<int> from;
        for (int i = 0; i < 2; ++i) {
          std::vector<std::byte> v;
          auto req = t.irecv(any_peer, 5, v);
          req.wait(deadline::after(5s));
          from.insert(req.info().peer);
          TCHECK(v.size() == static_cast<std::size_t>(req.info().peer) * 400000);
        }
        TCHECK(from == std::set<int>{1, 2});
        std::vector<int> small(10, -1);
        std::error_code ec;
        const bool done = t.irecv(1, 6, bytes_of(small)).wait(deadline::after(5s), ec);
        TCHECK(!done);
        TCHECK(ec == errc::message_truncated);
        t.irecv(1, 6, bytes_of(small)).wait(deadline::after(5s));  // the ring kept its place
        TCHECK(std::all_of(small.begin(), small.end(), [](int x) { return x == 2; }));
      } else {
        std::vector<int> payload(static_cast<std::size_t>(r) * 100000, r);
        t.isend(0, 5, sig_for(0), bytes_of(payload)).wait(deadline::after(5s));
        if (r == 1) {
          std::vector<int> big(300000, 1), next(10, 2);
          t.isend(0, 6, sig_for(0), bytes_of(big)).wait(deadline::after(5s));
          t.isend(0, 6, sig_for(0), bytes_of(next)).wait(deadline::after(5s));
        }
      }
    }, small_rings(single_copy));
  }
}

// Only `wait` drives a caller's own progress; the progress thread must finish what is polled
// with `test`, also a receive behind a message nobody has asked for yet, and a send to a peer
// that reads only later.
TEST_CASE("shm: operations polled with test alone complete through the progress thread", "[shm]") {
  const auto poll = [](shm_request& req) {
    const deadline d = deadline::after(10s);
    while (!req.test() && !d.expired()) std::this_thread::sleep_for(100us);
    return req.test();
  };
  for (std::size_t single_copy : both_paths) {
    INFO("single copy from " << single_copy << " bytes");
    run_shm(2, [&](int r, shm_transport& t) {
      std::vector<int> early(1 << 18), late(100), big(1 << 20);  // 1 MiB, 400 B, 4 MiB
      if (r == 0) {
        std::iota(early.begin(), early.end(), 1);
        std::iota(late.begin(), late.end(), 2);
        std::iota(big.begin(), big.end(), 3);
        auto first = t.isend(1, 1, sig_for(0), bytes_of(early));
        auto second = t.isend(1, 2, sig_for(0), bytes_of(late));
        auto third = t.isend(1, 3, sig_for(0), bytes_of(big));
        const bool all = poll(first) && poll(second) && poll(third);  // TCHECK holds a lock while it evaluates
        TCHECK(all);
      } else {
        std::vector<int> in_late(late.size()), in_early(early.size()), in_big(big.size());
        auto req = t.irecv(0, 2, bytes_of(in_late));  // behind tag 1, which nobody receives yet
        const bool done = poll(req);
        TCHECK(done);
        std::iota(late.begin(), late.end(), 2);
        TCHECK(in_late == late);
        std::this_thread::sleep_for(50ms);  // the sender polls its last send meanwhile
        t.irecv(0, 1, bytes_of(in_early)).wait(deadline::after(10s));
        t.irecv(0, 3, bytes_of(in_big)).wait(deadline::after(10s));
        std::iota(early.begin(), early.end(), 1);
        std::iota(big.begin(), big.end(), 3);
        TCHECK(in_early == early);
        TCHECK(in_big == big);
      }
    }, small_rings(single_copy));
  }
}

TEST_CASE("shm: a rank that leaves right after sending loses nothing and is then named as gone", "[shm]") {
  constexpr std::size_t n = 16 << 20;
  for (std::size_t single_copy : both_paths) {
    INFO("single copy from " << single_copy << " bytes");
    run_shm(2, [](int r, shm_transport& t) {
      if (r == 1) {
        std::vector<int> out(n / sizeof(int));
        std::iota(out.begin(), out.end(), 0);
        auto s = t.isend(0, 3, sig_for(0), bytes_of(out));
        t.leave();  // the send is not waited for: leaving drives it into the ring
      } else {
        std::this_thread::sleep_for(300ms);
        std::vector<int> in(n / sizeof(int), -1);
        t.irecv(1, 3, bytes_of(in)).wait(deadline::after(10s));
        std::vector<int> want(in.size());
        std::iota(want.begin(), want.end(), 0);
        TCHECK(in == want);
        std::vector<int> more(1);
        auto req = t.irecv(1, 3, bytes_of(more));
        std::error_code ec;
        const bool done = req.wait(deadline::after(5s), ec);  // not under the checks' lock
        TCHECK(!done);
        TCHECK(ec == errc::peer_lost);
        TCHECK(req.detail().find("rank 1") != std::string::npos);
      }
    }, small_rings(single_copy));
  }
}

TEST_CASE("shm: no segment name is left in /dev/shm once the group has formed", "[shm]") {
  std::atomic<int> formed{0};
  std::vector<testing::mapped_segment> mapped;
  run_shm(3, [&](int r, shm_transport& t) {
    communicator<shm_transport> c(std::move(t));
    c.barrier();
    if (r == 0) mapped = testing::segments_mapped_by({::getpid()});
    c.barrier();
    ++formed;
  });
  CHECK(formed == 3);
  REQUIRE(mapped.size() == 3);  // one inbox per rank
  for (const auto& s : mapped) {
    INFO(s.name);
    CHECK(s.unlinked);
    CHECK(!testing::listed_in_dev_shm(s.name));
  }
}

TEST_CASE("shm: a rank with another token is refused and named", "[shm]") {
  tcp_store_server server("127.0.0.1", 0, token);
  std::vector<std::string> errors(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r) {
    ts.emplace_back([&, r] {
      shm_options o = small_rings();
      o.timeout = 5s;
      if (r == 1) o.token = "another-job";
      try {
        tcp_store store("127.0.0.1", server.port(), deadline::after(5s), token);  // the store lets both in
        auto t = shm_transport::connect(store, r, 2, o);
      } catch (const error& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : ts) t.join();
  INFO(errors[0] << " | " << errors[1]);
  // Whichever side checks first refuses the other's inbox for its token and leaves; the other
  // then refuses too, or finds the inbox gone. Each names the other rank.
  CHECK(errors[0].find("rank 1's shared memory") != std::string::npos);
  CHECK(errors[1].find("rank 0's shared memory") != std::string::npos);
  CHECK((errors[0] + errors[1]).find("was not made with this job's token") != std::string::npos);
}

TEST_CASE("shm: a large send is read from the sender's memory once its receive comes", "[shm]") {
  // Through the rings a 1 MiB send completes as soon as the 4 MiB ring holds it; read in place
  // it completes only once the receiver has copied it, after its receive is posted.
  for (std::size_t single_copy : both_paths) {
    std::atomic<bool> done_before_receive{false};
    shm_options o = small_rings(single_copy);
    o.ring_bytes = 4 << 20;
    run_shm(2, [&](int r, shm_transport& t) {
      std::vector<int> v(256 << 10, 0);
      if (r == 0) {
        std::iota(v.begin(), v.end(), 1);
        auto s = t.isend(1, 9, sig_for(0), bytes_of(v));
        std::this_thread::sleep_for(200ms);
        done_before_receive = s.test();
        int go = 1;
        t.isend(1, 10, sig_for(0), std::as_bytes(std::span(&go, 1))).wait(deadline::after(5s));
        s.wait(deadline::after(5s));
      } else {
        int go = 0;
        t.irecv(0, 10, std::as_writable_bytes(std::span(&go, 1))).wait(deadline::after(5s));
        t.irecv(0, 9, bytes_of(v)).wait(deadline::after(5s));
        std::vector<int> want(v.size());
        std::iota(want.begin(), want.end(), 1);
        TCHECK(v == want);
      }
    }, o);
    INFO("single copy from " << single_copy << " bytes");
    CHECK(done_before_receive == (single_copy == 0));
  }
}

TEST_CASE("shm: malformed or unreadable remote ranges fail the receive as a protocol error", "[shm]") {
  // A remote frame whose ranges do not add up to its length, then one pointing at no memory.
  for (bool add_up : {false, true}) {
    std::string detail;
    std::error_code code;
    run_shm(2, [&](int r, shm_transport& t) {
      if (r == 1) {
        frame_header h;
        h.kind = frame_kind::remote;
        h.tag = 1;
        h.length = 4096;
        std::vector<std::byte> raw(frame_header::size + detail::shm::remote_descriptor_bytes);
        const auto hb = encode_frame(h);
        std::copy(hb.begin(), hb.end(), raw.begin());
        detail::wire::put(&raw[64], std::uint64_t{1});
        detail::wire::put(&raw[72], std::uint64_t{16});  // address 16: never mapped
        detail::wire::put(&raw[80], std::uint64_t{add_up ? 4096u : 100u});
        detail::shm::raw_writer::write(t, 0, raw);
        std::this_thread::sleep_for(200ms);
        return;
      }
      std::vector<int> in(1024);
      auto req = t.irecv(1, 1, bytes_of(in));
      req.wait(deadline::after(5s), code);
      detail = req.detail();
    });
    INFO(detail);
    CHECK(code == errc::protocol_error);
    CHECK(detail.find(add_up ? "rank 1's message cannot be read" : "malformed remote ranges") != std::string::npos);
  }
}

TEST_CASE("shm: a receive failed halfway through its message is never written to again", "[shm]") {
  // Rank 0's receive takes the first 4 KiB of a 64 KiB message, is cancelled and fails the group
  // (the linger passes), and its memory is made unreachable; the rest of the message then comes
  // and must be skipped: writing it would crash here, and free memory in a real program.
  constexpr std::size_t whole = 64 << 10, first = 4 << 10;
  std::atomic<int> stage{0};
  std::error_code later;
  shm_options o = small_rings(0);
  o.ring_bytes = 256 << 10;
  o.linger = 200ms;
  run_shm(2, [&](int r, shm_transport& t) {
    if (r == 1) {
      frame_header h;
      h.tag = 1;
      h.length = whole;
      const auto hb = encode_frame(h);
      std::vector<std::byte> raw(hb.begin(), hb.end());
      raw.resize(raw.size() + first, std::byte{7});
      detail::shm::raw_writer::write(t, 0, raw);
      while (stage.load() < 1) std::this_thread::yield();
      detail::shm::raw_writer::write(t, 0, std::vector<std::byte>(whole - first, std::byte{7}));
      stage.store(2);
      return;
    }
    void* page = ::mmap(nullptr, whole, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    TREQUIRE(page != MAP_FAILED);
    const std::span<std::byte> in(static_cast<std::byte*>(page), whole);
    {
      auto req = t.irecv(1, 1, in);
      for (auto give_up = deadline::after(5s); in[first - 1] != std::byte{7} && !give_up.expired();) req.test();
      TREQUIRE(in[first - 1] == std::byte{7});
      TREQUIRE(!req.test());
    }  // cancelled: still reading after the linger, so the group fails
    TREQUIRE(::mprotect(page, whole, PROT_NONE) == 0);
    stage.store(1);
    while (stage.load() < 2) std::this_thread::yield();
    std::vector<std::byte> next(16);
    auto req = t.irecv(1, 2, next);  // drives the ring past the rest of the message
    req.wait(deadline::after(5s), later);
    ::munmap(page, whole);
  }, o);
  CHECK(later == errc::cancelled);
}

TEST_CASE("shm: garbage in a ring fails the group with a protocol error naming the ring", "[shm]") {
  std::string detail;
  std::error_code code;
  run_shm(2, [&](int r, shm_transport& t) {
    if (r == 1) {
      std::vector<std::byte> junk(200, std::byte{0x5a});
      detail::shm::raw_writer::write(t, 0, junk);
      std::this_thread::sleep_for(200ms);
      return;
    }
    std::vector<int> in(10);
    auto req = t.irecv(1, 1, bytes_of(in));
    req.wait(deadline::after(5s), code);
    detail = req.detail();
  });
  INFO(detail);
  CHECK(code == errc::protocol_error);
  CHECK(detail.find("from rank 1 to 0") != std::string::npos);
  CHECK(detail.find("bad magic") != std::string::npos);
}

TEST_CASE("shm: collectives of every kind on 1 to 9 ranks match the serial reference", "[shm]") {
  for (int p = 1; p <= 9; ++p) {
    std::atomic<int> wrong{0};
    run_shm<basic_shm_transport<spin_then_block<20>>>(p, [&](int r, auto& t) {
      using T = std::remove_reference_t<decltype(t)>;
      communicator<T> c(std::move(t));
      testing::sweep_collectives(c, p, r, {0, 7, 1000, 70001}, wrong);
    });
    INFO(p << " ranks");
    CHECK(wrong == 0);
  }
}
