// The device trainers on the GPU (the allreduce one, and ZeRO stages 1, 2 and 3), against the serial
// simulation of tests/allreduce/simulation.hpp: over the staged communicator with ranks (threads)
// sharing one GPU, and over NCCL (one rank per GPU); the device updater against the host updaters.

#include <filesystem>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "../allreduce/simulation.hpp"
#include "../catch.hpp"
#include "../sharded/mixed_checks.hpp"
#include "../sharded/unit_model.hpp"  // unit_sizes
#include "device_linear_model.cuh"
#include "device_mixed_model.cuh"
#include "device_unit_model.cuh"
#include "dtrain/allreduce/device_trainer.hpp"
#include "dtrain/collective/nccl.hpp"
#include "dtrain/collective/staged.hpp"
#include "dtrain/rendezvous/file_store.hpp"
#include "dtrain/sharded/device_trainer.hpp"
#include "dtrain/transport/inproc.hpp"
#include "dtrain/updater/adam.hpp"
#include "dtrain/updater/device.hpp"
#include "dtrain/updater/momentum.hpp"
#include "gpu.hpp"

using namespace dtrain;
using namespace dtrain::testing;

static_assert(device_model<device_linear_model>);

namespace {

// Trains `steps` steps with `make_comm(rank, transport)`'s collective, by the allreduce device
// trainer (`Stage` void) or the sharded one at `Stage`; each rank's final weights.
template <class Stage = void, class MakeComm>
std::vector<std::vector<double>> train(int p, int steps, bool gaps, MakeComm make_comm) {
  std::vector<std::vector<double>> out(static_cast<std::size_t>(p));
  std::mutex m;
  std::vector<std::string> errors;
  allreduce::trainer_options o;
  o.first_bucket_bytes = 8 * 10;
  o.bucket_bytes = 8 * 50;
  sharded::trainer_options so;
  so.first_bucket_bytes = o.first_bucket_bytes;
  so.bucket_bytes = o.bucket_bytes;
  run_inproc(p, [&](int r, inproc_transport t) {
    try {
      dtrain::cuda::check(cudaSetDevice(r % dtrain::cuda::device_count()), "cudaSetDevice");
      auto data = data_of(r);
      device_linear_model model(tensor_sizes, data, r == 0 ? 0.25 : 1.0 + r, gaps);
      auto run = [&](auto& tr) {
        for (int k = 0; k < steps; ++k) {
          const std::size_t begin = (static_cast<std::size_t>(k) * batch) % 400;
          tr.step({begin, begin + batch});
        }
      };
      if constexpr (std::is_void_v<Stage>) {
        allreduce::device_trainer tr(make_comm(r, std::move(t)), momentum<double>(lr, mu), model, o);
        run(tr);
      } else {
        using comm_t = decltype(make_comm(r, std::move(t)));
        sharded::device_trainer<comm_t, Stage, momentum<double>, device_linear_model> tr(
            make_comm(r, std::move(t)), momentum<double>(lr, mu), model, so);
        run(tr);
      }
      out[static_cast<std::size_t>(r)] = model.weights();
    } catch (const std::exception& e) {
      std::lock_guard lock(m);
      errors.push_back("rank " + std::to_string(r) + ": " + e.what());
    }
  });
  for (const auto& e : errors) FAIL(e);
  return out;
}

void check_against_simulation(const std::vector<std::vector<double>>& got, int p, int steps) {
  const auto expected = simulate(p, steps, 1, 0);
  for (int r = 0; r < p; ++r) {
    const auto& w = got[static_cast<std::size_t>(r)];
    REQUIRE(w.size() == expected[0].size());
    for (std::size_t j = 0; j < w.size(); ++j) CHECK(w[j] == Approx(expected[0][j]).epsilon(1e-9));
    CHECK(w == got[0]);  // replicas bit-identical
  }
}

}  // namespace

TEST_CASE("device trainer on the GPU: staged ranks sharing a device train as the serial simulation", "[gpu][device]") {
  DTRAIN_REQUIRE_GPUS(1);
  for (bool gaps : {false, true}) {
    for (int p : {1, 2, 3}) {
      INFO("p=" << p << " gaps " << gaps);
      const auto got = train(
          p, 10, gaps, [](int, inproc_transport t) { return staged_communicator<inproc_transport>(std::move(t)); });
      check_against_simulation(got, p, 10);
    }
  }
}

TEST_CASE("device trainer on the GPU: NCCL, one rank per device, trains as the serial simulation",
          "[gpu][device][nccl]") {
  DTRAIN_REQUIRE_GPUS(1);
  const int p = dtrain::cuda::device_count();
  const auto dir = std::filesystem::temp_directory_path() / ("dtrain_device_trainer_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const auto got = train(p, 10, true, [&](int r, inproc_transport) {
    file_store store(dir.string());
    return nccl_communicator::connect(store, r, p);
  });
  check_against_simulation(got, p, 10);
  std::filesystem::remove_all(dir);
}

TEMPLATE_TEST_CASE("sharded device trainer on the GPU: staged ranks sharing a device train as the serial simulation",
                   "[gpu][device][sharded]", sharded::zero1, sharded::zero2) {
  DTRAIN_REQUIRE_GPUS(1);
  for (int p : {1, 2, 3}) {
    INFO("p=" << p);
    const auto got = train<TestType>(p, 10, true, [](int, inproc_transport t) {
      return staged_communicator<inproc_transport>(std::move(t));
    });
    check_against_simulation(got, p, 10);
  }
}

TEST_CASE("sharded device trainer on the GPU: stage 3, staged ranks sharing a device, trains as the serial simulation",
          "[gpu][device][sharded]") {
  DTRAIN_REQUIRE_GPUS(1);
  for (int p : {1, 2, 3}) {
    for (std::size_t limit : {1, 2}) {
      INFO("p=" << p << " limit_all_gathers " << limit);
      std::vector<std::vector<double>> got(static_cast<std::size_t>(p));
      std::vector<std::string> errors(static_cast<std::size_t>(p));
      run_inproc(p, [&](int r, inproc_transport t) {
        try {
          auto data = data_of(r);
          device_unit_model model(unit_sizes, data, r == 0 ? 0.25 : 1.0 + r);
          sharded::trainer_options o;
          o.limit_all_gathers = limit;
          using comm_t = staged_communicator<inproc_transport>;
          sharded::device_trainer<comm_t, sharded::zero3, momentum<double>, device_unit_model> tr(
              comm_t(std::move(t)), momentum<double>(lr, mu), model, o);
          for (int k = 0; k < 10; ++k) {
            const std::size_t begin = (static_cast<std::size_t>(k) * batch) % 400;
            tr.step({begin, begin + batch});
          }
          auto& w = got[static_cast<std::size_t>(r)];
          for (std::size_t u = 0; u < unit_sizes.size(); ++u) {
            const auto whole = tr.unit_parameters(u);
            w.insert(w.end(), whole.begin(), whole.end());
          }
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(r)] = e.what();
        }
      });
      for (const auto& e : errors) REQUIRE(e.empty());
      check_against_simulation(got, p, 10);
    }
  }
}

TEMPLATE_TEST_CASE("sharded device trainer on the GPU: NCCL, one rank per device, trains as the serial simulation",
                   "[gpu][device][nccl][sharded]", sharded::zero1, sharded::zero2) {
  DTRAIN_REQUIRE_GPUS(1);
  const int p = dtrain::cuda::device_count();
  const auto dir = std::filesystem::temp_directory_path() / ("dtrain_sharded_device_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const auto got = train<TestType>(p, 10, true, [&](int r, inproc_transport) {
    file_store store(dir.string());
    return nccl_communicator::connect(store, r, p);
  });
  check_against_simulation(got, p, 10);
  std::filesystem::remove_all(dir);
}

namespace {
// 16-bit models in mixed precision on the GPU, staged ranks sharing the device: what
// tests/sharded/device_trainer.cpp checks under Thrust's CPP system.
template <class Stage, class T, class Updater>
std::vector<rank_run> train_mixed(const run_spec& spec, Updater updater, sharded::trainer_options options) {
  using comm_t = staged_communicator<inproc_transport>;
  std::vector<rank_run> out(static_cast<std::size_t>(spec.p));
  std::mutex m;
  std::vector<std::string> errors;
  run_inproc(spec.p, [&](int r, inproc_transport t) {
    try {
      rank_run& mine = out[static_cast<std::size_t>(r)];
      const auto data = data_of(r);
      device_mixed_model<T> model(data, r == 0 ? 0.25 : 1.0 + r);
      inject_overflows(model.host, spec, r, mine);
      // skipped_changed stays 0: the device updater's state is not read here (the CPU test does)
      sharded::device_trainer<comm_t, Stage, Updater, device_mixed_model<T>> tr(comm_t(std::move(t)), updater, model,
                                                                                options);
      for (int k = spec.first_step; k < spec.first_step + spec.steps; ++k) {
        const std::size_t begin = (static_cast<std::size_t>(k) * batch) % 400;
        const auto res = tr.step({begin, begin + batch});
        mine.skipped.push_back(res.skipped);
        mine.scales.push_back(res.loss_scale);
      }
      mine.updates = tr.steps();
      mine.weights = model.weights();
    } catch (const std::exception& e) {
      std::lock_guard lock(m);
      errors.push_back("rank " + std::to_string(r) + ": " + e.what());
    }
  });
  for (const auto& e : errors) FAIL(e);
  return out;
}

sharded::trainer_options buckets16() { return small_buckets16<sharded::trainer_options>(); }
}  // namespace

TEMPLATE_TEST_CASE("sharded device trainer on the GPU: bf16 and float16 in mixed precision, with loss scaling",
                   "[gpu][device][sharded][mixed]", sharded::zero1, sharded::zero2) {
  DTRAIN_REQUIRE_GPUS(1);
  for (const int p : {1, 3}) {
    INFO("P = " << p);
    run_spec spec;
    spec.p = p;
    spec.steps = 30;
    require_matches<bfloat16>(train_mixed<TestType, bfloat16>(spec, adam<float>(1e-2), buckets16()),
                              mixed_training<bfloat16>(p, 30, adam<float>(1e-2)));
    require_matches<float16>(train_mixed<TestType, float16>(spec, adam<float>(1e-2), buckets16()),
                             mixed_training<float16>(p, 30, adam<float>(1e-2)));
  }
  sharded::trainer_options o = buckets16();
  o.scaling = small_scaling();
  check_skips_exactly_the_overflows([&](const run_spec& spec) {
    return train_mixed<TestType, float16>(spec, momentum<float>(1e-2), o);
  });
}

TEST_CASE("device updater on the GPU: momentum and Adam match the host updaters", "[gpu][device]") {
  DTRAIN_REQUIRE_GPUS(1);
  constexpr std::size_t n = 100000;
  std::vector<double> w(n), g(n);
  for (std::size_t i = 0; i < n; ++i) {
    w[i] = 0.001 * static_cast<double>(i % 1000) - 0.5;
    g[i] = 0.01 * static_cast<double>((i * 7) % 101) - 0.5;
  }
  auto run = [&](auto host) {
    device_updater dev(host);
    host.resize(n);
    dev.resize(n);
    dtrain::cuda::device_buffer<double> dw(n), dg(n);
    dtrain::cuda::check(cudaMemcpy(dw.data(), w.data(), n * sizeof(double), cudaMemcpyHostToDevice), "H2D");
    dtrain::cuda::check(cudaMemcpy(dg.data(), g.data(), n * sizeof(double), cudaMemcpyHostToDevice), "H2D");
    std::vector<double> hw = w;
    dtrain::cuda::stream s;
    for (int k = 0; k < 4; ++k) {
      const dtrain::step_info info{0, 1.0, static_cast<std::uint64_t>(k + 1)};  // adam reads the count
      host.step(std::span(hw), std::span<const double>(g), 0, info);
      dev.step(dw.span(), device_span<const double>(dg.span()), 0, info, s.get());
    }
    s.synchronize();
    std::vector<double> back(n);
    dtrain::cuda::check(cudaMemcpy(back.data(), dw.data(), n * sizeof(double), cudaMemcpyDeviceToHost), "D2H");
    std::size_t far = 0;
    for (std::size_t i = 0; i < n; ++i) far += std::abs(back[i] - hw[i]) > 1e-12 * (1 + std::abs(hw[i]));
    CHECK(far == 0);
  };
  run(momentum<double>(0.1, 0.9, true));
  run(adam<double>(0.01));
}
