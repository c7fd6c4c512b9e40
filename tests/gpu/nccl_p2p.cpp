// NCCL point-to-point on real GPUs: messages of device buffers checked against what was sent,
// whatever order sends and receives are posted in, tags received out of order, a wrong type or
// size refused naming both, a timed-out wait left pending, a cancelled receive withdrawn, bad
// arguments refused. One rank sends to itself on any GPU; several ranks (one thread per GPU,
// NCCL's rule) need two GPUs or more, which scripts/gpu-check.sh runs where it sees them.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../catch.hpp"
#include "dtrain/collective/nccl.hpp"
#include "dtrain/concepts/point_to_point.hpp"
#include "dtrain/flight/recorder.hpp"
#include "dtrain/rendezvous/file_store.hpp"
#include "gpu.hpp"
#include "nccl_helpers.hpp"

using namespace dtrain;
using namespace std::chrono_literals;

static_assert(point_to_point<nccl_communicator, float>);
static_assert(point_to_point<nccl_communicator, double>);
static_assert(completion<nccl_communicator::p2p_request>);

namespace {

using testing::fresh_dir;

// A device buffer holding `values`, and what it holds now.
template <class T>
cuda::device_buffer<T> on_device(const std::vector<T>& values) {
  cuda::device_buffer<T> d(values.size());
  testing::to_device(d.span(), values);
  return d;
}
template <class T>
std::vector<T> on_host(const cuda::device_buffer<T>& d) {
  return testing::to_host(d.span());
}

// Message `k` from rank `from`: distinct per sender, message and element, exact in float.
std::vector<float> message(int from, int k, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(from * 100000 + k * 1000 + static_cast<int>(i % 997));
  return v;
}

nccl_communicator one_rank(const std::string& name, std::chrono::milliseconds timeout = 60s) {
  file_store store(fresh_dir(name));
  nccl_options o;
  o.point_to_point = true;
  o.timeout = timeout;
  return nccl_communicator::connect(store, 0, 1, o);
}

// Runs `body(comm)` on `p` ranks, one thread and GPU each, with point-to-point lanes.
void on_ranks(int p, const std::string& name, const std::function<void(nccl_communicator&)>& body) {
  nccl_options o;
  o.point_to_point = true;
  o.timeout = 60s;
  const auto failures =
      testing::on_gpu_ranks(p, name, o, [&](nccl_communicator& comm, std::vector<std::string>&) { body(comm); });
  for (const auto& f : failures) FAIL_CHECK(f);
}

}  // namespace

TEST_CASE("nccl p2p: messages to itself land whole, sent first, received first, and tags out of order",
          "[gpu][nccl][p2p]") {
  DTRAIN_REQUIRE_GPUS(1);
  auto comm = one_rank("self");
  const std::size_t n = 4099;
  // Sent first: the message waits in scratch for its receive.
  auto a = on_device(message(0, 1, n));
  cuda::device_buffer<float> got(n);
  auto s = comm.isend(0, 7, device_span<const float>(a.span()));
  comm.recv(0, 7, got.span());
  s.wait(deadline::after(10s));
  CHECK(on_host(got) == message(0, 1, n));
  CHECK(s.info().sig.count == n);
  // Received first: the send lands in the waiting receive.
  auto b = on_device(message(0, 2, n));
  auto r = comm.irecv(0, 8, got.span());
  CHECK_FALSE(r.test());
  comm.send(0, 8, device_span<const float>(b.span()));
  r.wait(deadline::after(10s));
  CHECK(on_host(got) == message(0, 2, n));
  CHECK(r.info().sig.count == n);
  // Both messages in the flight recorder: on tag 7 a send and a receive, each the first there.
  int on_tag_7 = 0;
  flight::recorder::global().for_each([&](const flight::call& c) {
    if (c.sig.op != coll_op::message || c.tag != 7) return;
    ++on_tag_7;
    CHECK(c.sig.seq == 1);
    CHECK(c.sig.count == n);
    CHECK(c.peer == 0);
    CHECK(c.where == flight::state::completed);
  });
  CHECK(on_tag_7 == 2);
  // Many in flight on several tags, received in the opposite order, two on one tag in order.
  std::vector<cuda::device_buffer<float>> sent, into;
  std::vector<nccl_communicator::p2p_request> sends;
  for (int k = 0; k < 6; ++k) {
    sent.push_back(on_device(message(0, 10 + k, n + static_cast<std::size_t>(k))));
    into.emplace_back(n + static_cast<std::size_t>(k));
    const std::uint64_t tag = k < 2 ? 100 : 100 + static_cast<std::uint64_t>(k);
    sends.push_back(comm.isend(0, tag, device_span<const float>(sent.back().span())));
  }
  std::vector<nccl_communicator::p2p_request> receives;
  for (std::size_t k = 5; k >= 2; --k) receives.push_back(comm.irecv(0, 100 + k, into[k].span()));
  receives.push_back(comm.irecv(0, 100, into[0].span()));
  receives.push_back(comm.irecv(0, 100, into[1].span()));
  for (auto& q : receives) q.wait(deadline::after(10s));
  for (auto& q : sends) q.wait(deadline::after(10s));
  for (std::size_t k = 0; k < 6; ++k) CHECK(on_host(into[k]) == message(0, 10 + static_cast<int>(k), n + k));
}

TEST_CASE("nccl p2p: a receive of another type or size fails naming both, and the next message still lands",
          "[gpu][nccl][p2p]") {
  DTRAIN_REQUIRE_GPUS(1);
  auto comm = one_rank("mismatch");
  auto ten = on_device(message(0, 1, 10));
  cuda::device_buffer<float> eight(8);
  comm.isend(0, 3, device_span<const float>(ten.span())).wait(deadline::after(10s));
  auto r = comm.irecv(0, 3, eight.span());
  std::error_code ec;
  CHECK_FALSE(r.wait(deadline::after(10s), ec));
  CHECK(ec == errc::collective_mismatch);
  CHECK(r.info().sig.count == 10);
  auto again = comm.irecv(0, 3, eight.span());
  comm.isend(0, 3, device_span<const float>(ten.span()));
  CHECK_THROWS_WITH(again.wait(deadline::after(10s)),
                    Catch::Contains("expected 8 float32, the sender sent 10 float32") && Catch::Contains("tag 3"));
  cuda::device_buffer<double> doubles(10);
  comm.isend(0, 4, device_span<const float>(ten.span()));
  CHECK_THROWS_WITH(comm.recv(0, 4, doubles.span()),
                    Catch::Contains("expected 10 float64, the sender sent 10 float32"));
  cuda::device_buffer<float> right(10);
  comm.isend(0, 3, device_span<const float>(ten.span()));
  comm.recv(0, 3, right.span());
  CHECK(on_host(right) == message(0, 1, 10));
}

TEST_CASE("nccl p2p: a wait that times out leaves the receive pending, a cancelled one takes no message",
          "[gpu][nccl][p2p]") {
  DTRAIN_REQUIRE_GPUS(1);
  auto comm = one_rank("pending");
  cuda::device_buffer<float> first(5), second(5);
  auto r = comm.irecv(0, 1, first.span());
  std::error_code ec;
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(r.wait(deadline::after(200ms), ec));
  CHECK(ec == errc::timeout);
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  auto m = on_device(message(0, 1, 5));
  comm.send(0, 1, device_span<const float>(m.span()));
  CHECK(r.wait(deadline::after(10s), ec));
  CHECK(on_host(first) == message(0, 1, 5));
  // Cancelled before its message: the message goes to the next receive.
  auto withdrawn = comm.irecv(0, 2, first.span());
  withdrawn.cancel();
  CHECK(withdrawn.test());
  CHECK_FALSE(withdrawn.wait(deadline::after(0ms), ec));
  CHECK(ec == errc::cancelled);
  auto n = on_device(message(0, 2, 5));
  comm.send(0, 2, device_span<const float>(n.span()));
  comm.recv(0, 2, second.span());
  CHECK(on_host(second) == message(0, 2, 5));
  CHECK(on_host(first) == message(0, 1, 5));  // the withdrawn receive's buffer, untouched
  nccl_communicator::p2p_request moved = std::move(withdrawn), empty;
  CHECK(empty.test());
}

TEST_CASE("nccl p2p: bad peers, and a communicator formed without lanes, are refused naming them",
          "[gpu][nccl][p2p]") {
  DTRAIN_REQUIRE_GPUS(1);
  auto comm = one_rank("bad");
  cuda::device_buffer<float> b(4);
  CHECK_THROWS_WITH(comm.irecv(1, 0, b.span()), Catch::Contains("peer 1 outside a group of 1"));
  CHECK_THROWS_WITH(comm.isend(-1, 0, b.span()), Catch::Contains("peer -1 outside a group of 1"));
  file_store store(fresh_dir("plain"));
  auto plain = nccl_communicator::connect(store, 0, 1);
  CHECK_THROWS_WITH(plain.isend(0, 0, b.span()), Catch::Contains("nccl_options::point_to_point"));
}

TEST_CASE("nccl p2p: a ring where every rank receives first, a swap, and tags out of order, one rank per GPU",
          "[gpu][nccl][p2p]") {
  DTRAIN_REQUIRE_GPUS(2);
  const int p = std::min(cuda::device_count(), 4);
  on_ranks(p, "ring", [p](nccl_communicator& comm) {
    const int r = comm.rank(), next = (r + 1) % p, prev = (r + p - 1) % p;
    const std::size_t n = (1 << 20) + 3;  // beyond NCCL's eager sizes: a send waits for its receive
    cuda::device_buffer<float> in(n);
    auto mine = on_device(message(r, 0, n));
    auto recv = comm.irecv(prev, 0, in.span());
    auto send = comm.isend(next, 0, device_span<const float>(mine.span()));
    recv.wait(deadline::after(30s));
    send.wait(deadline::after(30s));
    if (on_host(in) != message(prev, 0, n)) throw std::runtime_error("ring: wrong payload");
    // Two tags, sent 1 then 2, received 2 then 1.
    std::vector<cuda::device_buffer<float>> out;
    out.push_back(on_device(message(r, 1, 64)));
    out.push_back(on_device(message(r, 2, 96)));
    cuda::device_buffer<float> one(64), two(96);
    auto s1 = comm.isend(next, 1, device_span<const float>(out[0].span()));
    auto s2 = comm.isend(next, 2, device_span<const float>(out[1].span()));
    comm.recv(prev, 2, two.span());
    comm.recv(prev, 1, one.span());
    s1.wait(deadline::after(30s));
    s2.wait(deadline::after(30s));
    if (on_host(one) != message(prev, 1, 64) || on_host(two) != message(prev, 2, 96)) {
      throw std::runtime_error("tags out of order: wrong payload");
    }
    // Ranks 0 and 1 swap, each receiving first.
    if (r > 1) return;
    const int other = 1 - r;
    cuda::device_buffer<float> theirs(n);
    auto rr = comm.irecv(other, 9, theirs.span());
    comm.send(other, 9, device_span<const float>(mine.span()));
    rr.wait(deadline::after(30s));
    if (on_host(theirs) != message(other, 0, n)) throw std::runtime_error("swap: wrong payload");
  });
}

TEST_CASE("nccl p2p: messages run beside collectives on another thread, one rank per GPU", "[gpu][nccl][p2p]") {
  DTRAIN_REQUIRE_GPUS(2);
  const int p = std::min(cuda::device_count(), 4);
  on_ranks(p, "beside", [p](nccl_communicator& comm) {
    const int r = comm.rank(), next = (r + 1) % p, prev = (r + p - 1) % p;
    const std::size_t n = 1 << 18;
    std::vector<float> ones(n, 1.0f);
    auto sums = on_device(ones);
    std::thread reduce([&] {
      for (int k = 0; k < 10; ++k) comm.allreduce(sums.span(), reduce_op::sum);
    });
    auto mine = on_device(message(r, 3, n));
    cuda::device_buffer<float> in(n);
    for (int k = 0; k < 20; ++k) {
      auto rq = comm.irecv(prev, 5, in.span());
      comm.send(next, 5, device_span<const float>(mine.span()));
      rq.wait(deadline::after(30s));
    }
    reduce.join();
    if (on_host(in) != message(prev, 3, n)) throw std::runtime_error("beside: wrong payload");
    const float expect = static_cast<float>(std::pow(static_cast<double>(p), 10));
    if (on_host(sums)[n - 1] != expect) throw std::runtime_error("beside: wrong allreduce");
  });
}
