// The staged communicator (device buffers over a host transport, reduced by Thrust) under
// Thrust's host systems, where "device" memory is host memory: every operation against a serial
// reference, sizes that do not divide by the group, bitwise-identical results on every rank.
// The same code runs on the GPU in a CUDA build (tests/gpu).

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "../catch.hpp"
#include "dtrain/collective/staged.hpp"
#include "dtrain/concepts/collective.hpp"
#include "dtrain/transport/inproc.hpp"

using namespace dtrain;

static_assert(collective<staged_communicator<inproc_transport>>);
static_assert(collective<staged_communicator<inproc_transport>, double>);

namespace {

double value(int rank, std::size_t i) {
  return static_cast<double>((rank + 1) * 100) + static_cast<double>(i % 89) / 8;
}

// Runs every operation on `p` ranks with `n` elements each; collects what differs from the
// reference (as text: Catch2 assertions stay on the main thread).
std::vector<std::string> run_all(int p, std::size_t n) {
  std::vector<std::string> failures;
  std::mutex m;
  std::vector<std::vector<double>> allreduced(static_cast<std::size_t>(p));
  run_inproc(p, [&](int r, inproc_transport t) {
    staged_communicator<inproc_transport> comm(std::move(t));
    auto fail = [&](const std::string& what) {
      std::lock_guard lock(m);
      failures.push_back("p=" + std::to_string(p) + " n=" + std::to_string(n) + " rank " + std::to_string(r) + ": " +
                         what);
    };
    std::vector<double> mine(n), out(n);
    for (std::size_t i = 0; i < n; ++i) mine[i] = value(r, i);
    for (reduce_op op : {reduce_op::sum, reduce_op::max, reduce_op::avg}) {
      comm.allreduce(std::span<const double>(mine), std::span(out), op);
      for (std::size_t i = 0; i < n; ++i) {
        double want = op == reduce_op::max ? value(p - 1, i) : 0;
        if (op != reduce_op::max) {
          for (int q = 0; q < p; ++q) want += value(q, i);  // rank order, as the server combines
          if (op == reduce_op::avg) want /= p;
        }
        if (out[i] != want) {
          fail("allreduce element " + std::to_string(i));
          break;
        }
      }
      if (op == reduce_op::sum) allreduced[static_cast<std::size_t>(r)] = out;
    }
    std::vector<double> buf = mine;
    comm.broadcast(std::span(buf), p - 1);
    for (std::size_t i = 0; i < n; ++i) {
      if (buf[i] != value(p - 1, i)) {
        fail("broadcast");
        break;
      }
    }
    std::vector<double> all(n * static_cast<std::size_t>(p));
    comm.allgather(std::span<const double>(mine), std::span(all));
    for (int q = 0; q < p; ++q) {
      if (all[static_cast<std::size_t>(q) * n] != value(q, 0)) fail("allgather block " + std::to_string(q));
    }
    std::vector<double> blocks(n * static_cast<std::size_t>(p)), block(n);
    for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i] = value(r, i);
    comm.reduce_scatter(std::span<const double>(blocks), std::span(block), reduce_op::sum);
    for (std::size_t i = 0; i < n; ++i) {
      double want = 0;
      for (int q = 0; q < p; ++q) want += value(q, static_cast<std::size_t>(r) * n + i);
      if (block[i] != want) {
        fail("reduce_scatter element " + std::to_string(i));
        break;
      }
    }
    std::vector<double> swapped(blocks.size());
    comm.alltoall(std::span<const double>(blocks), std::span(swapped));
    for (int q = 0; q < p; ++q) {
      const std::size_t at = static_cast<std::size_t>(q) * n;
      if (n > 0 && swapped[at] != value(q, static_cast<std::size_t>(r) * n))
        fail("alltoall block " + std::to_string(q));
    }
    std::vector<double> reduced(n, -1.0);
    comm.reduce(std::span<const double>(mine), std::span(reduced), reduce_op::sum, 0);
    if (r == 0 && reduced != allreduced[0]) fail("reduce at the root");
    if (r != 0 && reduced != std::vector<double>(n, -1.0)) fail("reduce touched a non-root output");
    comm.barrier();
  });
  for (int q = 1; q < p; ++q) {
    if (allreduced[static_cast<std::size_t>(q)] != allreduced[0]) failures.push_back("allreduce differs between ranks");
  }
  return failures;
}

}  // namespace

TEST_CASE("staged communicator: every operation matches the serial reference, bit-identical on every rank",
          "[collective][staged]") {
  for (int p : {1, 2, 3, 4}) {
    for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{100003}}) {
      const auto failures = run_all(p, n);
      CHECK(failures.empty());
      for (const auto& f : failures) FAIL_CHECK(f);
    }
  }
}

TEST_CASE("staged communicator: wrong sizes are refused", "[collective][staged]") {
  std::vector<std::string> errors(2);
  run_inproc(2, [&](int r, inproc_transport t) {
    staged_communicator<inproc_transport> comm(std::move(t));
    std::vector<float> a(10), b(9);
    try {
      comm.allreduce(std::span<const float>(a), std::span(b), reduce_op::sum);
    } catch (const dtrain::error& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  for (const auto& e : errors) CHECK_THAT(e, Catch::Contains("staged allreduce: buffers of 10 and 9 elements"));
}
