// The NCCL communicator on real GPUs: every collective against a host-computed reference, the
// asynchronous forms, wrong sizes refused before anything is enqueued, and a peer that never
// joins ending in a timeout that names the operation. One rank per GPU (NCCL's rule): world
// size 1 on any GPU, and one thread per device when there are several.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "../catch.hpp"
#include "dtrain/collective/communicator.hpp"
#include "dtrain/collective/nccl.hpp"
#include "dtrain/concepts/collective.hpp"
#include "dtrain/flight/recorder.hpp"
#include "dtrain/rendezvous/file_store.hpp"
#include "dtrain/transport/inproc.hpp"
#include "gpu.hpp"
#include "nccl_helpers.hpp"

using namespace dtrain;
using namespace std::chrono_literals;

static_assert(collective<nccl_communicator>);
static_assert(collective<nccl_communicator, double>);

namespace {

using testing::fresh_dir;
using testing::to_device;
using testing::to_host;

// Rank r's contribution: distinct per rank and element, exact in float.
float value(int rank, std::size_t i) { return static_cast<float>((rank + 1) * 1000 + static_cast<int>(i % 997)); }

// Every collective on `comm`, checked against the reference on the host. Results go to `failures`.
void exercise(nccl_communicator& comm, std::vector<std::string>& failures) {
  const int p = comm.size(), r = comm.rank();
  const std::size_t n = 1000 * static_cast<std::size_t>(p);
  cuda::device_buffer<float> a(n), b(n);
  std::vector<float> mine(n);
  for (std::size_t i = 0; i < n; ++i) mine[i] = value(r, i);
  auto expect = [&](bool ok, const std::string& what) {
    if (!ok) failures.push_back("rank " + std::to_string(r) + ": " + what);
  };
  // allreduce (in place, blocking)
  to_device(a.span(), mine);
  comm.allreduce(a.span(), reduce_op::sum);
  auto got = to_host(device_span<const float>(a.span()));
  bool ok = true;
  for (std::size_t i = 0; i < n; ++i) {
    float sum = 0;
    for (int q = 0; q < p; ++q) sum += value(q, i);
    ok = ok && got[i] == sum;
  }
  expect(ok, "allreduce sum");
  // iallreduce max, out of place
  to_device(a.span(), mine);
  auto req = comm.iallreduce(device_span<const float>(a.span()), b.span(), reduce_op::max);
  req.wait();
  got = to_host(device_span<const float>(b.span()));
  ok = true;
  for (std::size_t i = 0; i < n; ++i) ok = ok && got[i] == value(p - 1, i);
  expect(ok && req.test(), "iallreduce max");
  // broadcast from the last rank
  to_device(a.span(), mine);
  comm.broadcast(a.span(), p - 1);
  got = to_host(device_span<const float>(a.span()));
  ok = true;
  for (std::size_t i = 0; i < n; ++i) ok = ok && got[i] == value(p - 1, i);
  expect(ok, "broadcast");
  // reduce_scatter: block r of the sum
  const std::size_t blk = n / static_cast<std::size_t>(p);
  to_device(a.span(), mine);
  comm.reduce_scatter(device_span<const float>(a.span()), b.span().first(blk), reduce_op::sum);
  got = to_host(device_span<const float>(b.span().first(blk)));
  ok = true;
  for (std::size_t i = 0; i < blk; ++i) {
    float sum = 0;
    for (int q = 0; q < p; ++q) sum += value(q, static_cast<std::size_t>(r) * blk + i);
    ok = ok && got[i] == sum;
  }
  expect(ok, "reduce_scatter");
  // allgather: block q is rank q's first block
  to_device(a.span(), mine);
  comm.allgather(device_span<const float>(a.span().first(blk)), b.span());
  got = to_host(device_span<const float>(b.span()));
  ok = true;
  for (int q = 0; q < p; ++q) {
    for (std::size_t i = 0; i < blk; ++i) ok = ok && got[static_cast<std::size_t>(q) * blk + i] == value(q, i);
  }
  expect(ok, "allgather");
  // alltoall: block q of rank r's output is block r of rank q's input
  to_device(a.span(), mine);
  comm.alltoall(device_span<const float>(a.span()), b.span());
  got = to_host(device_span<const float>(b.span()));
  ok = true;
  for (int q = 0; q < p; ++q) {
    for (std::size_t i = 0; i < blk; ++i) {
      ok = ok && got[static_cast<std::size_t>(q) * blk + i] == value(q, static_cast<std::size_t>(r) * blk + i);
    }
  }
  expect(ok, "alltoall");
  // gather to 0, scatter from 0
  to_device(a.span(), mine);
  comm.gather(device_span<const float>(a.span().first(blk)), b.span(), 0);
  if (r == 0) {
    got = to_host(device_span<const float>(b.span()));
    ok = true;
    for (int q = 0; q < p; ++q) {
      for (std::size_t i = 0; i < blk; ++i) ok = ok && got[static_cast<std::size_t>(q) * blk + i] == value(q, i);
    }
    expect(ok, "gather");
  }
  comm.scatter(device_span<const float>(a.span()), b.span().first(blk), 0);
  got = to_host(device_span<const float>(b.span().first(blk)));
  ok = true;
  for (std::size_t i = 0; i < blk; ++i) ok = ok && got[i] == value(0, static_cast<std::size_t>(r) * blk + i);
  expect(ok, "scatter");
  comm.barrier();
  // Wrong sizes are refused before anything is enqueued; the communicator stays usable.
  try {
    comm.allgather(device_span<const float>(a.span().first(blk)), b.span().first(n - 1));
    expect(false, "allgather with a wrong output size was accepted");
  } catch (const dtrain::error& e) {
    expect(e.code() == errc::invalid_argument, std::string("wrong size: ") + e.what());
  }
  comm.barrier();
}

}  // namespace

TEST_CASE("nccl: every collective matches the host reference, one rank", "[gpu][nccl]") {
  DTRAIN_REQUIRE_GPUS(1);
  file_store store(fresh_dir("one"));
  auto comm = nccl_communicator::connect(store, 0, 1);
  std::vector<std::string> failures;
  exercise(comm, failures);
  for (const auto& f : failures) FAIL_CHECK(f);
}

TEST_CASE("nccl: every collective matches the host reference, one rank per GPU", "[gpu][nccl]") {
  DTRAIN_REQUIRE_GPUS(2);
  const int p = std::min(cuda::device_count(), 4);
  for (const auto& f : testing::on_gpu_ranks(p, "many", {}, exercise)) FAIL_CHECK(f);
}

TEST_CASE("nccl: a rank whose peer never joins times out, naming what it waited for", "[gpu][nccl]") {
  DTRAIN_REQUIRE_GPUS(1);
  file_store store(fresh_dir("missing"));
  nccl_options o;
  o.timeout = 3s;
  const auto t0 = std::chrono::steady_clock::now();
  // Rank 0 of 2 publishes the id and waits for rank 1, which never comes.
  CHECK_THROWS_WITH(nccl_communicator::connect(store, 0, 2, o), Catch::Contains("joining the group of 2 ranks"));
  CHECK(std::chrono::steady_clock::now() - t0 < 30s);
}

TEST_CASE("nccl: a group formed over a host communicator (the id broadcast through it) reduces correctly",
          "[gpu][nccl]") {
  DTRAIN_REQUIRE_GPUS(1);
  const int p = std::min(cuda::device_count(), 4);
  std::vector<std::vector<std::string>> failures(static_cast<std::size_t>(p));
  run_inproc(p, [&](int r, inproc_transport t) {
    try {
      communicator<inproc_transport> host(std::move(t));
      nccl_options o;
      o.device = r;
      auto comm = nccl_communicator::over(host, o);
      exercise(comm, failures[static_cast<std::size_t>(r)]);
    } catch (const std::exception& e) {
      failures[static_cast<std::size_t>(r)].push_back(e.what());
    }
  });
  for (const auto& fs : failures) {
    for (const auto& f : fs) FAIL_CHECK(f);
  }
}

TEST_CASE("nccl: the flight recorder keeps every call under the group's name, with its sequence number and end",
          "[gpu][nccl][flight]") {
  DTRAIN_REQUIRE_GPUS(1);
  file_store store(fresh_dir("flight"));
  nccl_options o;
  o.key = "flight_test";
  auto comm = nccl_communicator::connect(store, 0, 1, o);
  cuda::device_buffer<float> a(64);
  comm.allreduce(a.span(), reduce_op::max);
  comm.broadcast(a.span(), 0);
  struct seen {
    std::string op, redop, where;
    std::uint64_t seq, count;
    std::int64_t start_us, end_us;
  };
  auto ours = [] {
    std::vector<seen> calls;
    flight::recorder::global().for_each([&](const flight::call& c) {
      if (std::string(c.group) != "nccl/flight_test") return;
      calls.push_back({std::string(coll_op_name(c.sig.op)), std::string(reduce_op_name(c.sig.redop)),
                       std::string(flight::state_name(c.where)), c.sig.seq, c.sig.count, c.start_us, c.end_us});
    });
    return calls;
  };
  auto r = comm.iallreduce(a.span(), reduce_op::sum);
  auto calls = ours();
  REQUIRE(calls.size() == 3);
  CHECK(calls[2].where == "started");  // completed only once waited for
  r.wait();
  calls = ours();
  REQUIRE(calls.size() == 3);
  CHECK(calls[0].op == "allreduce");
  CHECK(calls[0].redop == "max");
  CHECK(calls[1].op == "broadcast");
  CHECK(calls[2].op == "allreduce");
  CHECK(calls[2].redop == "sum");
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(calls[i].seq == i + 1);
    CHECK(calls[i].count == 64);
    CHECK(calls[i].where == "completed");
    CHECK(calls[i].start_us > 0);
    CHECK(calls[i].end_us >= calls[i].start_us);
  }
}
