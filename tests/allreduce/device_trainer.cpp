// The device trainer and device updater under Thrust's CPP system, where "device" memory is host
// memory: the code a CUDA build runs on the GPU, checked here against the same serial simulation
// as the host trainer, and against the host updaters bit for bit. tests/gpu runs it on a GPU.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "../catch.hpp"
#include "dtrain/allreduce/device_trainer.hpp"
#include "dtrain/allreduce/trainer.hpp"
#include "dtrain/collective/communicator.hpp"
#include "dtrain/collective/staged.hpp"
#include "dtrain/transport/group.hpp"
#include "dtrain/transport/inproc.hpp"
#include "dtrain/updater/adagrad.hpp"
#include "dtrain/updater/adam.hpp"
#include "dtrain/updater/device.hpp"
#include "dtrain/updater/ftrl.hpp"
#include "dtrain/updater/momentum.hpp"
#include "dtrain/updater/rmsprop.hpp"
#include "dtrain/updater/sgd.hpp"
#include "device_linear_model.hpp"
#include "simulation.hpp"

using namespace dtrain;
using namespace dtrain::testing;
using comm_t = staged_communicator<inproc_transport>;

namespace {

std::vector<std::vector<double>> train(int p, int steps, allreduce::trainer_options options, bool gaps) {
  std::vector<std::vector<double>> out(static_cast<std::size_t>(p));
  run_inproc(p, [&](int r, inproc_transport t) {
    auto data = data_of(r);
    device_linear_model m(tensor_sizes, data, r == 0 ? 0.25 : 1.0 + r, gaps);  // the broadcast fixes the start
    allreduce::device_trainer tr(comm_t(std::move(t)), momentum<double>(lr, mu), m, options);
    for (int k = 0; k < steps; ++k) {
      const std::size_t begin = (static_cast<std::size_t>(k) * batch) % 400;
      tr.step({begin, begin + batch});
    }
    out[static_cast<std::size_t>(r)] = m.weights();
  });
  return out;
}

template <class Updater>
void check_device_updater_matches_host(Updater host) {
  constexpr std::size_t n = 1000;
  std::vector<double> w_host(n), w_dev(n), g(n);
  for (std::size_t i = 0; i < n; ++i) w_host[i] = w_dev[i] = 0.01 * static_cast<double>(i % 37) - 0.2;
  device_updater<Updater> dev(host);
  host.resize(n);
  dev.resize(n / 2);
  dev.resize(n);  // growing keeps the old state and zeroes the new
  for (int step = 0; step < 5; ++step) {
    for (std::size_t i = 0; i < n; ++i)
      g[i] = 0.1 * static_cast<double>((i * 7 + static_cast<std::size_t>(step)) % 11) - 0.5;
    // two ranges with offsets, as a trainer steps tensor by tensor
    const step_info info{0, 1.0, static_cast<std::uint64_t>(step + 1)};  // adam reads the count
    host.step(std::span(w_host).first(300), std::span<const double>(g).first(300), 0, info);
    host.step(std::span(w_host).subspan(300), std::span<const double>(g).subspan(300), 300, info);
    dev.step(std::span(w_dev).first(300), std::span<const double>(g).first(300), 0, info);
    dev.step(std::span(w_dev).subspan(300), std::span<const double>(g).subspan(300), 300, info);
  }
  CHECK(w_dev == w_host);
  CHECK(std::vector<double>(dev.state().begin(), dev.state().end()) ==
        std::vector<double>(host.state().begin(), host.state().end()));
}

}  // namespace

TEST_CASE("device_updater: every updater's rule on Thrust's device gives the host updater's bits", "[device]") {
  check_device_updater_matches_host(sgd<double>(0.1));
  check_device_updater_matches_host(momentum<double>(0.1, 0.9, true));
  check_device_updater_matches_host(adagrad<double>(0.1));
  check_device_updater_matches_host(rmsprop<double>(0.01));
  check_device_updater_matches_host(adam<double>(0.01));
  check_device_updater_matches_host(ftrl<double>(0.1, 1.0, 0.01, 0.1));
}

TEST_CASE("device_trainer: synchronous training equals the serial simulation, P = 1-4", "[device]") {
  allreduce::trainer_options o;
  o.first_bucket_bytes = 8 * 10;  // several buckets in flight
  o.bucket_bytes = 8 * 50;
  for (bool gaps : {false, true}) {  // in place, and through the bucket buffer
    for (int p = 1; p <= 4; ++p) {
      const auto expected = simulate(p, 12, 1, 0);
      const auto got = train(p, 12, o, gaps);
      for (int r = 0; r < p; ++r) {
        INFO("p=" << p << " rank " << r << " gaps " << gaps);
        const auto& w = got[static_cast<std::size_t>(r)];
        REQUIRE(w.size() == expected[0].size());
        for (std::size_t j = 0; j < w.size(); ++j) CHECK(w[j] == Approx(expected[0][j]).epsilon(1e-12));
        CHECK(w == got[0]);  // replicas bit-identical
      }
    }
  }
}

TEST_CASE("device_trainer: local SGD averages the parameters every tau steps", "[device]") {
  allreduce::trainer_options o;
  o.average_every = 3;
  o.local_sgd_after = 2;
  const auto expected = simulate(3, 11, 3, 2);
  const auto got = train(3, 11, o, true);
  for (int r = 0; r < 3; ++r) {
    const auto& w = got[static_cast<std::size_t>(r)];
    const auto& e = expected[static_cast<std::size_t>(r)];
    for (std::size_t j = 0; j < w.size(); ++j) CHECK(w[j] == Approx(e[j]).epsilon(1e-12));
  }
}

TEST_CASE("device_trainer: refuses mismatched models, naming the rank", "[device]") {
  std::vector<std::string> errors(2);
  run_inproc(2, [&](int r, inproc_transport t) {
    auto data = data_of(r);
    std::vector<std::size_t> sizes = tensor_sizes;
    if (r == 1) sizes.back() += 1;
    device_linear_model m(sizes, data, 0.25);
    try {
      allreduce::device_trainer tr(comm_t(std::move(t)), sgd<double>(0.1), m);
    } catch (const error& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  for (const auto& e : errors) {
    CHECK(e.find("ranks disagree on the model") != std::string::npos);
    CHECK(e.find("rank 1 has") != std::string::npos);
  }
}

TEST_CASE("device_trainer: fp16 and bf16 compression stay within half precision, as on the host", "[device]") {
  // One step from the common start: the update's error is the compression's (g/P rounded to 16
  // bits, then each partial sum), the bound the host trainer's test uses.
  const auto exact = simulate(4, 1, 1, 0)[0];
  for (auto c : {allreduce::compression::fp16, allreduce::compression::bf16}) {
    allreduce::trainer_options o;
    o.first_bucket_bytes = 8 * 10;
    o.bucket_bytes = 8 * 50;
    o.compress = c;
    const auto got = train(4, 1, o, true);
    double worst = 0, largest = 0;
    for (std::size_t j = 0; j < exact.size(); ++j) {
      worst = std::max(worst, std::fabs(got[0][j] - exact[j]));
      largest = std::max(largest, std::fabs(exact[j] - 0.25));
    }
    const double unit = c == allreduce::compression::fp16 ? 0x1p-11 : 0x1p-8;
    INFO("compression " << static_cast<int>(c) << " worst error " << worst << " of steps up to " << largest);
    CHECK(worst <= 4 * unit * largest);
    CHECK(worst > 0);  // it really went through 16 bits
    for (const auto& w : got) CHECK(w == got[0]);
  }
}

TEST_CASE("device_trainer: memory() counts its bucket and the updater's state, in device memory under CUDA",
          "[device]") {
  // 130 doubles (tensors 3, 40, 1, 17, 60, 9), momentum's one slot; buckets of 80 bytes first, then
  // 400: {9, 60} = 69, {17, 1, 40} = 58, {3}, so the bucket buffer holds 69.
  allreduce::trainer_options o;
  o.first_bucket_bytes = 8 * 10;
  o.bucket_bytes = 8 * 50;
  std::vector<memory_use> held(2);
  run_inproc(2, [&](int r, inproc_transport t) {
    auto data = data_of(r);
    device_linear_model m(tensor_sizes, data, 0.25, true);
    allreduce::device_trainer tr(comm_t(std::move(t)), momentum<double>(lr, mu), m, o);
    tr.step({0, batch});
    held[static_cast<std::size_t>(r)] = tr.memory();
  });
  constexpr bool on_device = allreduce::thrust_backend<device_linear_model>::device_resident;
  for (const memory_use& m : held) {
    CHECK(m.buffers == 69 * 8);
    CHECK(m.optimizer_state == 130 * 8);
    CHECK(m.parameters + m.gradients == 0);
    CHECK(m.device == (on_device ? m.buffers + m.optimizer_state : 0));
  }
}

TEST_CASE("device_trainer: a job resumed from its checkpoint continues bit for bit, and the file loads on the host",
          "[device][checkpoint]") {
  using group = process_group<inproc_transport>;
  using staged_group = staged_communicator<group>;
  constexpr int p = 2;
  std::vector<std::vector<double>> straight(p), resumed(p), saved(p), host_loaded(p), host_resumed(p);
  run_inproc(p, [&](int r, inproc_transport t) {
    group world(std::move(t));  // copies share the endpoint: one trainer after another
    const std::string path =
        (std::filesystem::temp_directory_path() /
         ("dtrain_device_trainer." + std::to_string(::getpid()) + "." + std::to_string(r) + ".ckpt"))
            .string();
    auto data = data_of(r);
    auto batch_at = [](int k) {
      const std::size_t begin = (static_cast<std::size_t>(k) * batch) % 400;
      return std::pair<std::size_t, std::size_t>{begin, begin + batch};
    };
    const auto rz = static_cast<std::size_t>(r);
    {
      device_linear_model m(tensor_sizes, data, 0.25, true);
      allreduce::device_trainer tr(staged_group(world), adam<double>(0.05), m);
      for (int k = 0; k < 2; ++k) tr.step(batch_at(k));
      tr.save(path);
      saved[rz] = m.weights();
      for (int k = 2; k < 5; ++k) tr.step(batch_at(k));
      straight[rz] = m.weights();
    }
    {
      device_linear_model m(tensor_sizes, data, 3.0, true);  // other weights and rate: the load sets them
      allreduce::device_trainer tr(staged_group(world), adam<double>(0.5), m);
      tr.load(path);
      for (int k = 2; k < 5; ++k) tr.step(batch_at(k));  // Adam's state and step count restored
      resumed[rz] = m.weights();
    }
    {
      linear_model m(tensor_sizes, data, 3.0, true);
      allreduce::trainer tr(communicator<group>(world), adam<double>(0.5), m);
      tr.load(path);
      host_loaded[rz] = m.weights();
      for (int k = 2; k < 5; ++k) tr.step(batch_at(k));  // the host reads Adam's state and step too
      host_resumed[rz] = m.weights();
    }
    std::filesystem::remove(path);
  });
  for (int r = 0; r < p; ++r) {
    INFO("rank " << r);
    CHECK(resumed[static_cast<std::size_t>(r)] == straight[static_cast<std::size_t>(r)]);
    CHECK(host_loaded[static_cast<std::size_t>(r)] == saved[static_cast<std::size_t>(r)]);
    // Two ranks: a sum of two and a halving round alike in either collective, so the bits agree.
    CHECK(host_resumed[static_cast<std::size_t>(r)] == straight[static_cast<std::size_t>(r)]);
    CHECK(saved[static_cast<std::size_t>(r)] != straight[static_cast<std::size_t>(r)]);  // it trained on
  }
}
