// The pipeline executor on device memory (pipeline/device_link.hpp): stages talk through the
// staged communicator's point-to-point messages over real TCP on loopback (ranks as threads),
// under Thrust's CPP system, where device buffers are host memory and staging is a copy: the code
// a CUDA build runs with ranks sharing a GPU. Every schedule leaves the parameters bit for bit where
// serial gradient accumulation does (PipeDream where its weight-stashing equations do), and
// neighbours built with different partitions fail at the handshake, naming both.

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "../catch.hpp"
#include "../support/thread_ranks.hpp"
#include "dtrain/collective/staged.hpp"
#include "dtrain/pipeline/device_link.hpp"
#include "dtrain/transport/tcp.hpp"
#include "dtrain/updater/adam.hpp"
#include "dtrain/updater/sgd.hpp"
#include "device_case.hpp"

using namespace dtrain;
using namespace std::chrono_literals;

namespace {

using staged = staged_communicator<tcp_transport>;
using mlp = testing::mlp_stage<double>;

static_assert(stage<mlp, thrust_device_memory>, "under Thrust's CPP system a host stage is a device stage");

template <class Body>
void run_staged(int n, Body body) {
  const std::string token = "device-pipeline";
  tcp_options o;
  o.token = token;
  o.timeout = 20s;
  auto connect = [&](tcp_store& store, int r) { return tcp_transport::connect(store, r, n, o, "127.0.0.1"); };
  testing::run_thread_ranks(n, token, connect, [&](int r, tcp_transport& t) {
    staged comm(std::move(t));
    body(r, comm);
  });
}

template <class Schedule, class Updater>
void check_exact(const Schedule& schedule, const Updater& updater, int max_ranks) {
  for (int p = 1; p <= max_ranks; ++p) {
    for (int m : {1, 3, 8}) {
      std::atomic<int> wrong{0};
      std::string first;
      std::mutex mu;
      run_staged(p, [&](int, staged& comm) {
        std::string mine;
        auto make = [](std::vector<int> w, int from, int to, int batch) { return mlp(std::move(w), from, to, batch); };
        wrong += testing::device_case_wrong<mlp>(comm, schedule, updater, m, 3, make, mine);
        std::lock_guard lock(mu);
        if (first.empty()) first = mine;
      });
      INFO(Schedule::name << " p " << p << " m " << m << ": " << first);
      CHECK(wrong.load() == 0);
    }
  }
}

}  // namespace

TEST_CASE("device pipeline: every schedule over staged messages equals the serial reference bit for bit",
          "[pipeline][staged]") {
  check_exact(pipeline::gpipe{}, sgd<double>(0.1), 3);
  check_exact(pipeline::gpipe{true}, adam<double>(0.01), 3);
  check_exact(pipeline::one_f_one_b{}, adam<double>(0.01), 4);
  check_exact(pipeline::interleaved_one_f_one_b{2}, sgd<double>(0.1), 3);
  check_exact(pipeline::pipedream{}, adam<double>(0.01), 3);
}

TEST_CASE("device pipeline: neighbours built with different partitions fail at the handshake, naming both",
          "[pipeline][staged]") {
  std::vector<std::string> said(2);
  run_staged(2, [&](int r, staged& comm) {
    const auto widths = testing::test_widths();
    // Rank 0 ends its stage at layer 3, rank 1 starts at layer 4: 6 elements sent, 8 expected.
    std::vector<mlp> chunk;
    chunk.emplace_back(widths, r == 0 ? 0 : 4, r == 0 ? 3 : static_cast<int>(widths.size()) - 1, testing::test_batch);
    pipeline::executor<staged, mlp> run(comm, std::span(chunk));
    try {
      run.handshake(pipeline::pipeline_shape{2, 1, 4}, "one_f_one_b");
    } catch (const dtrain::error& e) {
      said[static_cast<std::size_t>(r)] = e.what();
    }
  });
  CHECK(said[0].empty());
  CHECK_THAT(said[1], Catch::Contains("stage 1 (rank 1) and stage 0 (rank 0) disagree on the activation") &&
                          Catch::Contains("24 elements expected here, 18 sent there"));
}
