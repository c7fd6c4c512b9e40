// The sharded device trainer (ZeRO stages 1 and 2 on Thrust's device memory) under Thrust's CPP
// system, where device memory is host memory: the code a CUDA build runs on the GPU, checked
// against the same serial references as the host sharded trainer, and against that trainer;
// 16-bit models in mixed precision against the serial mixed simulation, with loss scaling.

#include <algorithm>
#include <cstddef>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "../allreduce/checks.hpp"  // require_close, sharded_buckets
#include "../allreduce/device_linear_model.hpp"
#include "../allreduce/simulation.hpp"
#include "../catch.hpp"
#include "../support/files.hpp"
#include "mixed_checks.hpp"
#include "mixed_models.hpp"
#include "references.hpp"
#include "dtrain/collective/communicator.hpp"
#include "dtrain/collective/staged.hpp"
#include "dtrain/sharded/device_trainer.hpp"
#include "dtrain/sharded/trainer.hpp"
#include "dtrain/transport/group.hpp"
#include "dtrain/transport/inproc.hpp"
#include "dtrain/updater/adagrad.hpp"
#include "dtrain/updater/adam.hpp"
#include "dtrain/updater/ftrl.hpp"
#include "dtrain/updater/momentum.hpp"
#include "dtrain/updater/rmsprop.hpp"

using namespace dtrain;
using namespace dtrain::testing;
using staged_t = staged_communicator<inproc_transport>;

namespace {

// Every rank's weights after `steps` steps of the device trainer (`device`) or the host one, both
// over the staged communicator: the same reductions in the same order, so the same bits.
template <class Stage, class Updater>
std::vector<std::vector<double>> train(bool device, int p, int steps, Updater updater, bool gaps = false) {
  std::vector<std::vector<double>> out(static_cast<std::size_t>(p));
  run_inproc(p, [&](int r, inproc_transport t) {
    auto data = data_of(r);
    device_linear_model m(tensor_sizes, data, r == 0 ? 0.25 : 1.0 + r, gaps);  // the broadcast must undo r's start
    auto run = [&](auto& tr) {
      for (int k = 0; k < steps; ++k) {
        const std::size_t begin = (static_cast<std::size_t>(k) * batch) % 400;
        tr.step({begin, begin + batch});
      }
    };
    if (device) {
      sharded::device_trainer<staged_t, Stage, Updater, device_linear_model> tr(staged_t(std::move(t)), updater, m,
                                                                                sharded_buckets());
      run(tr);
    } else {
      sharded::trainer<staged_t, Stage, Updater, linear_model> tr(staged_t(std::move(t)), updater, m,
                                                                  sharded_buckets());
      run(tr);
    }
    out[static_cast<std::size_t>(r)] = m.weights();
  });
  return out;
}

// mixed_linear_model with the stream a device model names.
template <class T>
struct device_mixed_model : mixed_linear_model<T> {
  using mixed_linear_model<T>::mixed_linear_model;
  detail::thrust_space::stream_handle stream() const noexcept { return {}; }
};
static_assert(device_model<device_mixed_model<bfloat16>>);

sharded::trainer_options buckets16() { return small_buckets16<sharded::trainer_options>(); }

// The device trainer's run, or (`device` false) the host trainer's on the same staged collective.
template <class Stage, class T, class Updater>
std::vector<rank_run> train_mixed(const run_spec& spec, Updater updater, sharded::trainer_options options,
                                  bool device = true) {
  std::vector<rank_run> out(static_cast<std::size_t>(spec.p));
  run_inproc(spec.p, [&](int r, inproc_transport t) {
    rank_run& mine = out[static_cast<std::size_t>(r)];
    const auto data = data_of(r);
    device_mixed_model<T> m(data, r == 0 ? 0.25 : 1.0 + r);  // the broadcast must undo r's start
    inject_overflows(m, spec, r, mine);
    if (device) {
      sharded::device_trainer<staged_t, Stage, Updater, device_mixed_model<T>> tr(staged_t(std::move(t)), updater, m,
                                                                                   options);
      record_steps(tr, spec, mine, [&] { return m.weights(); });
    } else {
      sharded::trainer<staged_t, Stage, Updater, mixed_linear_model<T>> tr(staged_t(std::move(t)), updater, m, options);
      record_steps(tr, spec, mine, [&] { return m.weights(); });
    }
    mine.weights = m.weights();
  });
  return out;
}

}  // namespace

TEMPLATE_TEST_CASE("sharded device trainer: a 16-bit model with float master weights equals the mixed simulation",
                   "[sharded][device][mixed]", sharded::zero1, sharded::zero2) {
  for (const int p : {1, 3, 4}) {
    INFO("P = " << p);
    run_spec spec;
    spec.p = p;
    spec.steps = 30;
    require_matches<bfloat16>(train_mixed<TestType, bfloat16>(spec, adam<float>(1e-2), buckets16()),
                              mixed_training<bfloat16>(p, 30, adam<float>(1e-2)));
    require_matches<float16>(train_mixed<TestType, float16>(spec, adam<float>(1e-2), buckets16()),
                             mixed_training<float16>(p, 30, adam<float>(1e-2)));
  }
  // The device converts with the host's rounding: the host trainer's bits, on the same collective,
  // in either precision of the reduction (momentum: a sum where an average was due would show).
  run_spec spec;
  spec.steps = 40;
  for (const auto precision : {sharded::reduce_precision::master, sharded::reduce_precision::model}) {
    sharded::trainer_options o = buckets16();
    o.reduce_in = precision;
    CHECK(train_mixed<TestType, bfloat16>(spec, momentum<float>(1e-2, 0.9f), o)[0].weights ==
          train_mixed<TestType, bfloat16>(spec, momentum<float>(1e-2, 0.9f), o, false)[0].weights);
    CHECK(train_mixed<TestType, float16>(spec, adam<float>(1e-2), o)[0].weights ==
          train_mixed<TestType, float16>(spec, adam<float>(1e-2), o, false)[0].weights);
  }
  // Reducing in the model's precision rounds the wire to 16 bits: within the host's bound of fp64.
  sharded::trainer_options in_model = buckets16();
  in_model.reduce_in = sharded::reduce_precision::model;
  const auto got = train_mixed<TestType, bfloat16>(spec, adam<float>(1e-2), in_model);
  CHECK(distance(got[0].weights, serial_training(3, 40, adam<double>(1e-2))) < 5e-3);
  CHECK(got[0].weights != train_mixed<TestType, bfloat16>(spec, adam<float>(1e-2), buckets16())[0].weights);
  // Adam's steps of 5e-4 are below half of bfloat16's spacing at 0.25 (2^-9): a master kept in
  // 16 bits would round every update away and never move.
  run_spec one;
  one.steps = 30;
  const auto slow = train_mixed<TestType, bfloat16>(one, adam<float>(5e-4), buckets16());
  CHECK(std::count(slow[0].weights.begin(), slow[0].weights.end(), 0.25) < 10);
}

TEMPLATE_TEST_CASE("sharded device trainer: loss scaling skips exactly the steps whose gradients overflowed",
                   "[sharded][device][mixed]", sharded::zero1, sharded::zero2) {
  sharded::trainer_options o = buckets16();
  o.scaling = small_scaling();
  check_skips_exactly_the_overflows([&](const run_spec& spec) {
    return train_mixed<TestType, float16>(spec, momentum<float>(1e-2), o);
  });
}

TEMPLATE_TEST_CASE("sharded device trainer equals the serial simulation, replicas bit-identical", "[sharded][device]",
                   sharded::zero1, sharded::zero2) {
  for (int p : {1, 2, 3, 5, 8}) {
    for (bool gaps : {false, true}) {
      INFO("ranks " << p << (gaps ? ", tensors apart" : ""));
      const auto got = train<TestType>(true, p, 30, momentum<double>(lr, mu), gaps);
      require_close(got[0], simulate(p, 30, 1, 0)[0], 1e-12);
      for (const auto& w : got) REQUIRE(w == got[0]);
      REQUIRE(got[0] == train<TestType>(false, p, 30, momentum<double>(lr, mu), gaps)[0]);  // host backend's bits
    }
  }
}

TEMPLATE_TEST_CASE("sharded device Adam, Adagrad, RMSProp and FTRL equal one updater over the whole model",
                   "[sharded][device]", sharded::zero1, sharded::zero2) {
  for (int p : {2, 3, 5}) {
    INFO("ranks " << p);
    const auto got = train<TestType>(true, p, 25, adam<double>(0.01));
    require_close(got[0], serial_training(p, 25, adam<double>(0.01)), 1e-12);
    for (const auto& w : got) REQUIRE(w == got[0]);
    require_close(train<TestType>(true, p, 25, adagrad<double>(0.05))[0],
                  serial_training(p, 25, adagrad<double>(0.05)), 1e-12);
    require_close(train<TestType>(true, p, 25, rmsprop<double>(0.01))[0],
                  serial_training(p, 25, rmsprop<double>(0.01)), 1e-12);
    const ftrl<double> proximal(0.5, 1.0, 0.01, 0.01);
    require_close(train<TestType>(true, p, 25, proximal)[0], serial_training(p, 25, proximal), 1e-12);
  }
}

TEMPLATE_TEST_CASE("sharded device trainer: hybrid sharding trains as every rank averaging, with its group's slice",
                   "[sharded][device]", sharded::zero1, sharded::zero2) {
  // `groups` groups of `width` ranks over process groups of one world: rank r shards with
  // r / width's group and is replicated across its column r % width, all of it staged.
  using group_t = staged_communicator<process_group<inproc_transport>>;
  for (const auto& shape : {std::pair{2, 2}, std::pair{2, 3}, std::pair{3, 2}}) {
    const int groups = shape.first, width = shape.second;
    const int p = groups * width;
    INFO(groups << " groups of " << width);
    std::vector<std::vector<double>> weights(static_cast<std::size_t>(p));
    std::vector<std::size_t> slice_bytes(static_cast<std::size_t>(p));
    run_inproc(p, [&](int r, inproc_transport t) {
      process_group<inproc_transport> world(std::move(t));
      auto data = data_of(r);
      device_linear_model m(tensor_sizes, data, r == 0 ? 0.25 : 1.0 + r);  // rank 0's start must reach all
      sharded::device_trainer<group_t, TestType, momentum<double>, device_linear_model, group_t> tr(
          group_t(*world.split(r / width, r)), group_t(*world.split(r % width, r)), momentum<double>(lr, mu), m,
          sharded_buckets());
      for (int k = 0; k < 30; ++k) {
        const std::size_t begin = (static_cast<std::size_t>(k) * batch) % 400;
        tr.step({begin, begin + batch});
      }
      weights[static_cast<std::size_t>(r)] = m.weights();
      slice_bytes[static_cast<std::size_t>(r)] = tr.memory().parameters;
    });
    require_close(weights[0], simulate(p, 30, 1, 0)[0], 1e-12);
    const auto w = static_cast<std::size_t>(width);
    for (std::size_t r = 0; r < weights.size(); ++r) {
      CHECK(weights[r] == weights[0]);
      CHECK(slice_bytes[r] == ((69 + w - 1) / w + (61 + w - 1) / w) * sizeof(double));  // buckets of 69 and 61
    }
  }
}

TEST_CASE("sharded device trainer: stage 1 leaves the averaged gradient in the model, stage 2 each rank's own",
          "[sharded][device]") {
  // After one step from w = 0.25 everywhere: the mean of the replicas' gradients, or rank r's.
  constexpr int p = 3;
  std::vector<std::vector<double>> own(p, std::vector<double>(dim()));
  std::vector<double> mean(dim(), 0.0), w0(dim(), 0.25);
  for (int r = 0; r < p; ++r) {
    least_squares_gradient(data_of(r), w0, 0, batch, own[static_cast<std::size_t>(r)]);
    for (std::size_t j = 0; j < dim(); ++j) mean[j] += own[static_cast<std::size_t>(r)][j] / p;
  }
  auto gradients_after_one_step = [&]<class Stage>(Stage) {
    std::vector<std::vector<double>> got(p);
    run_inproc(p, [&](int r, inproc_transport t) {
      auto data = data_of(r);
      device_linear_model m(tensor_sizes, data, 0.25);
      sharded::device_trainer<staged_t, Stage, momentum<double>, device_linear_model> tr(
          staged_t(std::move(t)), momentum<double>(lr, mu), m, sharded_buckets());
      tr.step({0, batch});
      auto& mine = got[static_cast<std::size_t>(r)];
      for (std::size_t i = 0; i < m.tensor_count(); ++i) {
        mine.insert(mine.end(), m.gradients(i).begin(), m.gradients(i).end());
      }
    });
    return got;
  };
  const auto stage1 = gradients_after_one_step(sharded::zero1{});
  const auto stage2 = gradients_after_one_step(sharded::zero2{});
  for (std::size_t r = 0; r < p; ++r) {
    INFO("rank " << r);
    require_close(stage1[r], mean, 1e-13);
    require_close(stage2[r], own[r], 1e-15);
  }
}

TEST_CASE("sharded device trainer: each rank's state and gradient are its slice, in device memory under CUDA",
          "[sharded][device]") {
  // 130 doubles in buckets of 69 and 61 (sharded_buckets): a rank's slices are ceil(69 / P) +
  // ceil(61 / P) values, Adam keeps two per value, and the buffer is the larger bucket padded.
  const std::size_t d = sizeof(double);
  const std::size_t slices[] = {0, 130, 66, 44, 34}, buffer[] = {0, 69, 70, 69, 72};
  for (int p : {1, 2, 3, 4}) {
    INFO("ranks " << p);
    const auto P = static_cast<std::size_t>(p);
    std::vector<memory_use> held(P);
    run_inproc(p, [&](int r, inproc_transport t) {
      auto data = data_of(r);
      device_linear_model m(tensor_sizes, data, 0.25);
      sharded::device_trainer<staged_t, sharded::zero2, adam<double>, device_linear_model> tr(
          staged_t(std::move(t)), adam<double>(), m, sharded_buckets());
      tr.step({0, batch});
      held[static_cast<std::size_t>(r)] = tr.memory();
    });
    for (const memory_use& m : held) {
      CHECK(m.parameters == slices[p] * d);
      CHECK(m.gradients == slices[p] * d);
      CHECK(m.optimizer_state == 2 * slices[p] * d);
      CHECK(m.buffers == buffer[p] * d);
      CHECK(m.device == (THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA ? m.total() : 0));
    }
  }
}

TEST_CASE("sharded device trainer: a bf16 shard holds float master, gradient and state, and 16-bit buffers",
          "[sharded][device][mixed]") {
  // 130 bf16 values in buckets of 69 and 61 (buckets16) on 3 ranks: slices of 23 + 21 = 44 float
  // values each, Adam two per value; buffers of the larger bucket padded (69): a float one and a
  // bf16 one reducing in float, a bf16 one and a bf16 slice (23) reducing in bf16 at stage 2.
  struct expected {
    sharded::reduce_precision in;
    bool stage2;
    std::size_t buffers;
  };
  for (const expected e : {expected{sharded::reduce_precision::master, true, 69 * 4 + 69 * 2},
                           expected{sharded::reduce_precision::model, true, 69 * 2 + 23 * 2},
                           expected{sharded::reduce_precision::master, false, 69 * 4 + 69 * 2},
                           expected{sharded::reduce_precision::model, false, 69 * 2}}) {
    INFO((e.stage2 ? "zero2" : "zero1") << (e.in == sharded::reduce_precision::model ? ", in bf16" : ", in float"));
    std::vector<memory_use> held(3);
    run_inproc(3, [&](int r, inproc_transport t) {
      const auto data = data_of(r);
      device_mixed_model<bfloat16> m(data, 0.25);
      sharded::trainer_options o = buckets16();
      o.reduce_in = e.in;
      auto step_and_measure = [&](auto& tr) {
        tr.step({0, batch});
        held[static_cast<std::size_t>(r)] = tr.memory();
      };
      if (e.stage2) {
        sharded::device_trainer<staged_t, sharded::zero2, adam<float>, device_mixed_model<bfloat16>> tr(
            staged_t(std::move(t)), adam<float>(), m, o);
        step_and_measure(tr);
      } else {
        sharded::device_trainer<staged_t, sharded::zero1, adam<float>, device_mixed_model<bfloat16>> tr(
            staged_t(std::move(t)), adam<float>(), m, o);
        step_and_measure(tr);
      }
    });
    for (const memory_use& m : held) {
      CHECK(m.parameters == 44 * 4);
      CHECK(m.gradients == 44 * 4);
      CHECK(m.optimizer_state == 2 * 44 * 4);
      CHECK(m.buffers == e.buffers);
    }
  }
}

TEST_CASE("sharded device trainer: mismatched models fail on every rank", "[sharded][device]") {
  std::vector<std::string> errors(2);
  run_inproc(2, [&](int r, inproc_transport t) {
    auto data = data_of(r);
    std::vector<std::size_t> sizes = tensor_sizes;
    if (r == 1) sizes.back() += 1;
    device_linear_model m(sizes, data, 0.25);
    try {
      sharded::device_trainer<staged_t, sharded::zero1, adam<double>, device_linear_model> tr(staged_t(std::move(t)),
                                                                                               adam<double>(), m);
    } catch (const error& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  for (const auto& e : errors) {
    CHECK(e.find("sharded::device_trainer<zero1>: ranks disagree on the model") != std::string::npos);
    CHECK(e.find("elements: rank 0 has 130, rank 1 has 131") != std::string::npos);
  }
}

namespace {

// One segment of a checkpointed job: `ranks` ranks load `load` (unless empty), take steps
// [from, to), save `save` (unless empty), and return every rank's weights; on the device trainer
// over staged ranks, or (`device` false) the host one over a ring.
template <class Stage>
std::vector<std::vector<double>> checkpointed(bool device, int ranks, int from, int to, const std::string& load,
                                              const std::string& save) {
  std::vector<std::vector<double>> out(static_cast<std::size_t>(ranks));
  run_inproc(ranks, [&](int r, inproc_transport t) {
    auto data = data_of(r);
    auto go = [&](auto& tr) {
      if (!load.empty()) tr.load(load);
      for (int k = from; k < to; ++k) {
        const std::size_t begin = (static_cast<std::size_t>(k) * batch) % 400;
        tr.step({begin, begin + batch});
      }
      if (!save.empty()) tr.save(save);
    };
    const double start = load.empty() ? 0.25 : 3.0;  // a load must set the weights and the rate
    const double rate = load.empty() ? 0.05 : 0.5;
    if (device) {
      device_linear_model m(tensor_sizes, data, start, true);
      sharded::device_trainer<staged_t, Stage, adam<double>, device_linear_model> tr(
          staged_t(std::move(t)), adam<double>(rate), m, sharded_buckets());
      go(tr);
      out[static_cast<std::size_t>(r)] = m.weights();
    } else {
      linear_model m(tensor_sizes, data, start, true);
      sharded::trainer<ring<inproc_transport>, Stage, adam<double>, linear_model> tr(
          ring<inproc_transport>(std::move(t)), adam<double>(rate), m, sharded_buckets());
      go(tr);
      out[static_cast<std::size_t>(r)] = m.weights();
    }
  });
  return out;
}

}  // namespace

TEMPLATE_TEST_CASE("sharded device trainer: a job resumed from its set continues bit for bit, re-sharded on the host",
                   "[sharded][device][checkpoint]", sharded::zero1, sharded::zero2) {
  temp_dir dir;
  const std::string a = dir.path + "/a", b = dir.path + "/b";
  const auto saved = checkpointed<TestType>(true, 2, 0, 3, "", a);
  const auto resumed = checkpointed<TestType>(true, 2, 3, 7, a, "");
  REQUIRE(resumed == checkpointed<TestType>(true, 2, 0, 7, "", ""));  // one uninterrupted run's bits
  // The device's set is the host trainer's: 3 host ranks take the 2 device ranks' slices (their
  // weights are the saved ones) and save them in their own cut, which brings the device job back.
  for (const auto& w : checkpointed<TestType>(false, 3, 3, 3, a, b)) REQUIRE(w == saved[0]);
  REQUIRE(checkpointed<TestType>(true, 2, 3, 7, b, "") == resumed);
  // And a host set loads on the device.
  checkpointed<TestType>(false, 2, 0, 3, "", b);
  REQUIRE(checkpointed<TestType>(true, 2, 3, 7, b, "") == resumed);
}
