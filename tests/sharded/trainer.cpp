// The sharded trainer (ZeRO stages 1 and 2) against serial references of the same equations:
// the allreduce trainer's simulation for momentum SGD, one Adam over the whole model for Adam;
// each rank's share of the state against the closed form; start-up agreement and misuse.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "../allreduce/checks.hpp"  // require_close, small_buckets
#include "../allreduce/linear_model.hpp"
#include "../allreduce/simulation.hpp"
#include "../catch.hpp"
#include "references.hpp"
#include "dtrain/allreduce/trainer.hpp"
#include "dtrain/collective/communicator.hpp"
#include "dtrain/sharded/trainer.hpp"
#include "dtrain/transport/inproc.hpp"
#include "dtrain/updater/adagrad.hpp"
#include "dtrain/updater/adam.hpp"
#include "dtrain/updater/ftrl.hpp"
#include "dtrain/updater/momentum.hpp"
#include "dtrain/updater/rmsprop.hpp"

using namespace dtrain;
using namespace dtrain::testing;
using comm_t = ring<inproc_transport>;

namespace {

template <class Stage, class Updater>
std::vector<std::vector<double>> train(int p, int steps, Updater updater, sharded::trainer_options options,
                                       bool shuffled_ready_order = false, bool gaps = false) {
  std::vector<std::vector<double>> out(static_cast<std::size_t>(p));
  run_inproc(p, [&](int r, inproc_transport t) {
    auto data = data_of(r);
    linear_model m(tensor_sizes, data, r == 0 ? 0.25 : 1.0 + r, gaps);  // the broadcast must undo r's start
    if (shuffled_ready_order) {
      std::mt19937 gen(static_cast<unsigned>(r));
      std::shuffle(m.ready_order().begin(), m.ready_order().end(), gen);
    }
    sharded::trainer<comm_t, Stage, Updater, linear_model> tr(comm_t(std::move(t)), updater, m, options);
    for (int k = 0; k < steps; ++k) {
      const std::size_t begin = (static_cast<std::size_t>(k) * batch) % 400;
      tr.step({begin, begin + batch});
    }
    out[static_cast<std::size_t>(r)] = m.weights();
  });
  return out;
}

}  // namespace

TEMPLATE_TEST_CASE("sharded trainer equals the serial simulation, replicas bit-identical", "[sharded]", sharded::zero1,
                   sharded::zero2) {
  for (int p : {1, 2, 3, 4, 5, 8}) {
    for (int variant = 0; variant < 3; ++variant) {
      const bool shuffled = variant == 1, gaps = variant == 2;
      INFO("ranks " << p << (shuffled ? ", per-rank ready order" : "") << (gaps ? ", tensors apart" : ""));
      const auto got = train<TestType>(p, 30, momentum<double>(lr, mu), sharded_buckets(), shuffled, gaps);
      const auto want = simulate(p, 30, 1, 0);
      require_close(got[0], want[0], 1e-12);
      for (const auto& w : got) REQUIRE(w == got[0]);
    }
  }
}

TEMPLATE_TEST_CASE("sharded Adam, Adagrad, RMSProp and FTRL equal one updater over the whole model", "[sharded]",
                   sharded::zero1, sharded::zero2) {
  for (int p : {2, 3, 5, 8}) {
    INFO("ranks " << p);
    const auto got = train<TestType>(p, 25, adam<double>(0.01), sharded_buckets());
    require_close(got[0], serial_training(p, 25, adam<double>(0.01)), 1e-12);
    for (const auto& w : got) REQUIRE(w == got[0]);
    require_close(train<TestType>(p, 25, adagrad<double>(0.05), sharded_buckets())[0],
                  serial_training(p, 25, adagrad<double>(0.05)), 1e-12);
    require_close(train<TestType>(p, 25, rmsprop<double>(0.01), sharded_buckets())[0],
                  serial_training(p, 25, rmsprop<double>(0.01)), 1e-12);
    const ftrl<double> proximal(0.5, 1.0, 0.01, 0.01);  // two slots, and weights computed from them
    const std::vector<double> want = serial_training(p, 25, proximal);
    REQUIRE(std::count(want.begin(), want.end(), 0.0) < 13);  // l1 leaves most weights non-zero
    require_close(train<TestType>(p, 25, proximal, sharded_buckets())[0], want, 1e-12);
  }
}

TEST_CASE("each rank holds its slice of the optimizer state and gradient, not the whole", "[sharded]") {
  // Adam keeps two values per parameter, momentum one. With the default buckets (1 MiB) the
  // model's 130 parameters are one bucket: each rank's slice is ceil(130 / P). With the small
  // buckets, 69 and 61 parameters: ceil(69 / P) + ceil(61 / P), and the buffer is the larger
  // bucket padded, ceil(69 / P) P.
  const std::size_t d = sizeof(double);
  const std::size_t one_bucket[] = {0, 130, 65, 44, 33}, two_buckets[] = {0, 130, 66, 44, 34};
  const std::size_t buffer[] = {0, 69, 70, 69, 72};
  for (int p : {1, 2, 3, 4}) {
    INFO("ranks " << p);
    const auto P = static_cast<std::size_t>(p);
    std::vector<sharded::memory_use> adam_peak(P), adam_now(P), momentum_peak(P);
    run_inproc(p, [&](int r, inproc_transport t) {
      const auto R = static_cast<std::size_t>(r);
      auto data = data_of(r);
      linear_model m(tensor_sizes, data, 0.25), n(tensor_sizes, data, 0.25);
      sharded::trainer<comm_t, sharded::zero2, adam<double>, linear_model> a(comm_t(std::move(t)), adam<double>(), m);
      a.step({0, batch});
      adam_peak[R] = a.peak_memory();
      adam_now[R] = a.memory();
    });
    run_inproc(p, [&](int r, inproc_transport t) {
      auto data = data_of(r);
      linear_model m(tensor_sizes, data, 0.25);
      sharded::trainer<comm_t, sharded::zero1, momentum<double>, linear_model> tr(
          comm_t(std::move(t)), momentum<double>(lr, mu), m, sharded_buckets());
      tr.step({0, batch});
      momentum_peak[static_cast<std::size_t>(r)] = tr.peak_memory();
    });
    for (std::size_t r = 0; r < P; ++r) {
      INFO("rank " << r);
      CHECK(adam_now[r].total() == adam_peak[r].total());  // nothing grows after construction
      CHECK(adam_peak[r].optimizer_state == 2 * one_bucket[p] * d);
      CHECK(adam_peak[r].parameters == one_bucket[p] * d);
      CHECK(adam_peak[r].gradients == one_bucket[p] * d);
      CHECK(adam_peak[r].buffers == one_bucket[p] * P * d);
      CHECK(momentum_peak[r].optimizer_state == two_buckets[p] * d);
      CHECK(momentum_peak[r].parameters == two_buckets[p] * d);
      CHECK(momentum_peak[r].gradients == two_buckets[p] * d);
      CHECK(momentum_peak[r].buffers == buffer[p] * d);
    }
  }
}

namespace {
// Counts the collectives of doubles a trainer calls, by kind, and runs them.
struct call_counts {
  std::size_t allreduce = 0, reduce_scatter = 0, allgather = 0;
};
class counting_ring : public comm_t {
 public:
  counting_ring(inproc_transport t, call_counts& c) : comm_t(std::move(t)), counts_(&c) {}
  using comm_t::allgather;
  using comm_t::allreduce;
  using comm_t::reduce_scatter;
  void allreduce(std::span<double> buf, reduce_op op) {
    ++counts_->allreduce;
    comm_t::allreduce(buf, op);
  }
  void reduce_scatter(std::span<const double> in, std::span<double> out, reduce_op op) {
    ++counts_->reduce_scatter;
    comm_t::reduce_scatter(in, out, op);
  }
  void allgather(std::span<double> buf) {
    ++counts_->allgather;
    comm_t::allgather(buf);
  }

 private:
  call_counts* counts_;
};
}  // namespace

TEMPLATE_TEST_CASE("stage 1 allreduces each bucket, stage 2 reduce-scatters it, both allgather it", "[sharded]",
                   sharded::zero1, sharded::zero2) {
  constexpr int p = 3, steps = 3;
  std::vector<call_counts> counts(p);
  run_inproc(p, [&](int r, inproc_transport t) {
    auto data = data_of(r);
    linear_model m(tensor_sizes, data, 0.25);
    sharded::trainer<counting_ring, TestType, momentum<double>, linear_model> tr(
        counting_ring(std::move(t), counts[static_cast<std::size_t>(r)]), momentum<double>(lr, mu), m,
        sharded_buckets());
    for (int k = 0; k < steps; ++k) tr.step({0, batch});
  });
  const std::size_t buckets = 2;  // 69 and 61 parameters (the test above)
  const bool stage1 = std::is_same_v<TestType, sharded::zero1>;
  for (const auto& c : counts) {
    CHECK(c.allreduce == (stage1 ? buckets * steps : 0));
    CHECK(c.reduce_scatter == (stage1 ? 0 : buckets * steps));
    CHECK(c.allgather == buckets * steps);
  }
}

TEST_CASE("stage 1 leaves the averaged gradient in the model, stage 2 each rank's own", "[sharded]") {
  // After one step from w = 0.25 everywhere: the mean of the replicas' gradients, or rank r's.
  constexpr int p = 3;
  std::vector<std::vector<double>> own(p, std::vector<double>(dim())), mean_of(1, std::vector<double>(dim(), 0.0));
  std::vector<double> w0(dim(), 0.25);
  for (int r = 0; r < p; ++r) {
    least_squares_gradient(data_of(r), w0, 0, batch, own[static_cast<std::size_t>(r)]);
    for (std::size_t j = 0; j < dim(); ++j) mean_of[0][j] += own[static_cast<std::size_t>(r)][j] / p;
  }
  auto gradients_after_one_step = [&]<class Stage>(Stage) {
    std::vector<std::vector<double>> got(p);
    run_inproc(p, [&](int r, inproc_transport t) {
      auto data = data_of(r);
      linear_model m(tensor_sizes, data, 0.25);
      sharded::trainer<comm_t, Stage, momentum<double>, linear_model> tr(comm_t(std::move(t)), momentum<double>(lr, mu),
                                                                         m, sharded_buckets());
      tr.step({0, batch});
      for (std::size_t i = 0; i < m.tensor_count(); ++i) {
        got[static_cast<std::size_t>(r)].insert(got[static_cast<std::size_t>(r)].end(), m.gradients(i).begin(),
                                                m.gradients(i).end());
      }
    });
    return got;
  };
  const auto stage1 = gradients_after_one_step(sharded::zero1{});
  const auto stage2 = gradients_after_one_step(sharded::zero2{});
  for (std::size_t r = 0; r < p; ++r) {
    INFO("rank " << r);
    require_close(stage1[r], mean_of[0], 1e-13);
    require_close(stage2[r], own[r], 1e-15);
  }
}

TEST_CASE("ranks with different models or stages fail at start-up, all of them, naming the rank", "[sharded]") {
  std::vector<std::string> errors(3);
  run_inproc(3, [&](int r, inproc_transport t) {
    auto data = data_of(r);
    std::vector<std::size_t> sizes = tensor_sizes;
    if (r == 2) sizes = {3, 40, 1, 17, 59, 10};  // the same total, another split
    linear_model m(sizes, data, 0.25);
    try {
      sharded::trainer<comm_t, sharded::zero2, momentum<double>, linear_model> tr(comm_t(std::move(t)),
                                                                                  momentum<double>(lr, mu), m);
    } catch (const error& e) {
      if (e.code() == make_error_code(errc::invalid_argument)) errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  std::vector<std::string> stages(3);
  run_inproc(3, [&](int r, inproc_transport t) {  // the same model; rank 1 at stage 1, the others at 2
    auto data = data_of(r);
    linear_model m(tensor_sizes, data, 0.25);
    try {
      if (r == 1) {
        sharded::trainer<comm_t, sharded::zero1, momentum<double>, linear_model> tr(comm_t(std::move(t)),
                                                                                    momentum<double>(lr, mu), m);
      } else {
        sharded::trainer<comm_t, sharded::zero2, momentum<double>, linear_model> tr(comm_t(std::move(t)),
                                                                                    momentum<double>(lr, mu), m);
      }
    } catch (const error& e) {
      if (e.code() == make_error_code(errc::invalid_argument)) stages[static_cast<std::size_t>(r)] = e.what();
    }
  });
  for (const auto& e : errors) {
    INFO(e);
    CHECK(e.find("ranks disagree on the model") != std::string::npos);
    CHECK(e.find("the tensors' sizes or their buckets (first_bucket_bytes, bucket_bytes): rank 0 has digest") !=
          std::string::npos);
    CHECK(e.find("rank 2 has digest") != std::string::npos);
  }
  for (const auto& e : stages) {
    INFO(e);
    CHECK(e.find("ranks disagree on the model, the buckets, the stage or the precision") != std::string::npos);
    CHECK(e.find("stage: rank 0 has 2, rank 1 has 1") != std::string::npos);
  }
}

TEST_CASE("a model that never reports a gradient gets a clear error, and the trainer stays broken", "[sharded]") {
  std::vector<std::string> errors(2), again(2);
  run_inproc(2, [&](int r, inproc_transport t) {
    auto data = data_of(r);
    linear_model m(tensor_sizes, data, 0.25);
    sharded::trainer<comm_t, sharded::zero1, momentum<double>, linear_model> tr(comm_t(std::move(t)),
                                                                                momentum<double>(lr, mu), m);
    m.unused = [](std::size_t tensor) { return tensor == 3; };
    for (auto* message : {&errors, &again}) {
      try {
        tr.step({0, batch});
      } catch (const error& e) {
        (*message)[static_cast<std::size_t>(r)] = e.what();
      }
    }
  });
  for (const auto& e : errors) CHECK(e.find("never reported tensor 3") != std::string::npos);
  for (const auto& e : again) CHECK(e.find("sharded::trainer<zero1>: an earlier step failed") != std::string::npos);
}
