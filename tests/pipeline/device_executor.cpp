// The pipeline executor on device memory (pipeline/device_link.hpp): stages talk through the
// staged communicator's point-to-point messages over real TCP on loopback (ranks as threads),
// under Thrust's CPP system, where device buffers are host memory and staging is a copy: the code
// a CUDA build runs with ranks sharing a GPU. Every schedule leaves the parameters bit for bit where
// serial gradient accumulation does (PipeDream where its weight-stashing equations do), and
// neighbours built with different partitions fail at the handshake, naming both.

#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "../catch.hpp"
#include "../support/thread_ranks.hpp"
#include "dtrain/collective/staged.hpp"
#include "dtrain/pipeline/device_link.hpp"
#include "dtrain/topology/mesh.hpp"
#include "dtrain/transport/group.hpp"
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

// Runs body(rank, transport) on `n` threads, each a TCP rank on loopback.
template <class Body>
void run_tcp_world(int n, Body body) {
  const std::string token = "device-pipeline";
  tcp_options o;
  o.token = token;
  o.timeout = 20s;
  auto connect = [&](tcp_store& store, int r) { return tcp_transport::connect(store, r, n, o, "127.0.0.1"); };
  testing::run_thread_ranks(n, token, connect, body);
}

template <class Body>
void run_staged(int n, Body body) {
  run_tcp_world(n, [&](int r, tcp_transport& t) {
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

namespace {

// Rank r's stage of two partitions that disagree: rank 0 ends at layer 3, rank 1 starts at layer 4,
// so 6 x 3 = 18 elements are sent where 8 x 3 = 24 are expected.
std::vector<mlp> mismatched_chunk(int r) {
  const auto widths = testing::test_widths();
  std::vector<mlp> chunk;
  chunk.emplace_back(widths, r == 0 ? 0 : 4, r == 0 ? 3 : static_cast<int>(widths.size()) - 1, testing::test_batch);
  return chunk;
}

}  // namespace

TEST_CASE("device pipeline: neighbours built with different partitions fail at the handshake, naming both",
          "[pipeline][staged]") {
  std::vector<std::string> said(2);
  run_staged(2, [&](int r, staged& comm) {
    std::vector<mlp> chunk = mismatched_chunk(r);
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

TEST_CASE("device pipeline: a message of another size in a step fails naming both sides, without a handshake",
          "[pipeline][staged]") {
  std::vector<std::string> said(2);
  run_staged(2, [&](int r, staged& comm) {
    std::vector<mlp> chunk = mismatched_chunk(r);  // no handshake this time
    pipeline::executor_options o;
    o.timeout = 2s;  // rank 0 then waits for a gradient that never comes
    pipeline::executor<staged, mlp> run(comm, std::span(chunk), o);
    const pipeline::pipeline_shape shape{2, 1, 2};
    pipeline::step_hooks hooks;
    hooks.optimizer_step = [](int) {};
    try {
      run.run(pipeline::one_f_one_b{}.actions(r, shape), shape, 0, hooks);
    } catch (const dtrain::error& e) {
      said[static_cast<std::size_t>(r)] = e.what();
    }
  });
  CHECK_THAT(said[1], Catch::Contains("expected the activation of micro-batch 0 into stage 1 (float64, 24 elements) "
                                      "from stage 0 (rank 0), got a message with the activation of micro-batch 0 "
                                      "into stage 1 (float64, 18 elements)"));
  CHECK_THAT(said[0], Catch::Contains("waiting for the gradient of micro-batch 0 into stage 0"));
}

namespace {

using group = process_group<tcp_transport>;
using staged_group = staged_communicator<group>;

mlp make_mlp(std::vector<int> widths, int from, int to, int batch, int replica, int replicas) {
  return mlp(std::move(widths), from, to, batch, replica, replicas);
}

template <class Schedule>
void check_device_trainer(const Schedule& schedule) {
  for (int dp : {1, 2}) {
    for (int pp : {1, 2, 3}) {
      for (int m : {1, 4}) {
        std::atomic<int> wrong{0};
        std::string first;
        std::mutex mu;
        std::vector<std::vector<std::byte>> bits(static_cast<std::size_t>(dp * pp));
        run_tcp_world(dp * pp, [&](int, tcp_transport& t) {
          device_mesh<tcp_transport> mesh(group(std::move(t)), {{"dp", dp}, {"pp", pp}});
          const int replica = mesh.coordinate("dp");
          auto r =
              dp == 1
                  ? testing::device_trainer_case<mlp>(staged_group(mesh.group("pp")), pipeline::single_replica{}, 0,
                                                      schedule, adam<double>(0.01), m, 3, make_mlp)
                  : testing::device_trainer_case<mlp>(staged_group(mesh.group("pp")), staged_group(mesh.group("dp")),
                                                      replica, schedule, adam<double>(0.01), m, 3, make_mlp);
          bits[static_cast<std::size_t>(replica * pp + mesh.coordinate("pp"))] = std::move(r.bits);
          wrong += r.wrong;
          std::lock_guard lock(mu);
          if (r.wrong > 0 && first.empty()) first = r.first;
        });
        INFO(Schedule::name << " dp " << dp << " pp " << pp << " m " << m << ": " << first);
        CHECK(wrong.load() == 0);
        for (const auto& b : bits) REQUIRE(!b.empty());
        for (std::size_t i = static_cast<std::size_t>(pp); i < bits.size(); ++i) CHECK(bits[i] == bits[i % pp]);
      }
    }
  }
}

}  // namespace

TEST_CASE("device pipeline: the trainer on device memory, replicas averaged by a staged collective, equals serial "
          "training",
          "[pipeline][staged]") {
  check_device_trainer(pipeline::one_f_one_b{});
  check_device_trainer(pipeline::interleaved_one_f_one_b{2});
  check_device_trainer(pipeline::gpipe{true});
  check_device_trainer(pipeline::pipedream{});
}

TEST_CASE("device pipeline: a trainer on device memory resumed from its checkpoint continues bit for bit",
          "[pipeline][staged][checkpoint]") {
  for (int p : {1, 2}) {
    std::atomic<int> wrong{0};
    std::string first;
    std::mutex mu;
    run_tcp_world(p, [&](int r, tcp_transport& t) {
      const std::string path = (std::filesystem::temp_directory_path() /
                                ("dtrain_device_pipeline." + std::to_string(p) + "." + std::to_string(r) + ".ckpt"))
                                   .string();
      auto result = testing::device_trainer_case<mlp>(staged(std::move(t)), pipeline::single_replica{}, 0,
                                                      pipeline::one_f_one_b{}, adam<double>(0.01), 3, 4, make_mlp,
                                                      2, path);
      std::filesystem::remove(path);
      wrong += result.wrong;
      std::lock_guard lock(mu);
      if (result.wrong > 0 && first.empty()) first = result.first;
    });
    INFO("p " << p << ": " << first);
    CHECK(wrong.load() == 0);
  }
}
