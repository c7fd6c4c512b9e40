// The allreduce trainer's DDP essentials against the serial simulation (simulation.hpp):
// gradient accumulation equals one step on the concatenated batches, tensors a rank does not
// use get zero gradients on every rank, global-norm clipping scales as the serial norm says, and
// the trainer counts its own memory by kind; and its automatic first bucket cuts a small model
// only where every rank has cores to spare.

#include <algorithm>
#include <cmath>
#include <numeric>
#include <cstddef>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "../catch.hpp"
#include "dtrain/allreduce/trainer.hpp"
#include "dtrain/collective/communicator.hpp"
#include "dtrain/compress/topk.hpp"
#include "dtrain/transport/inproc.hpp"
#include "dtrain/updater/adam.hpp"
#include "dtrain/updater/momentum.hpp"
#include "linear_model.hpp"
#include "checks.hpp"
#include "simulation.hpp"
#include "../support/thread_checks.hpp"

using namespace dtrain;
using namespace dtrain::testing;
using comm_t = ring<inproc_transport>;

TEST_CASE("k - 1 accumulates and a step equal one step on the k batches together", "[allreduce]") {
  for (int p : {1, 2, 3}) {
    for (std::size_t k : {std::size_t{2}, std::size_t{5}}) {
      INFO("ranks " << p << ", k " << k);
      std::vector<std::vector<double>> got(static_cast<std::size_t>(p));
      std::vector<std::size_t> batches;
      run_inproc(p, [&](int r, inproc_transport t) {
        auto data = data_of(r);
        linear_model m(tensor_sizes, data, 0.25);
        allreduce::trainer tr(comm_t(std::move(t)), momentum<double>(lr, mu), m, small_buckets());
        for (int s = 0; s < 12; ++s) {
          const std::size_t begin = (static_cast<std::size_t>(s) * k * batch) % 400;
          for (std::size_t j = 0; j + 1 < k; ++j) tr.accumulate({begin + j * batch, begin + (j + 1) * batch});
          const auto result = tr.step({begin + (k - 1) * batch, begin + k * batch});
          if (r == 0) batches.push_back(result.batches);
        }
        got[static_cast<std::size_t>(r)] = m.weights();
      });
      sim_options o;
      o.batch_size = k * batch;
      require_close(got[0], simulate(p, 12, o)[0], 1e-11);
      for (const auto& w : got) REQUIRE(w == got[0]);
      for (std::size_t b : batches) CHECK(b == k);
    }
  }
}

TEST_CASE("tensors a rank does not use get zero gradients, on every rank", "[allreduce]") {
  // Rank r skips tensor (step + r) % 6 in odd steps, and rank 0 also skips tensor 5 throughout,
  // so some tensors are unused on one rank, some on all ranks of a step, in buckets in flight.
  auto unused = [](int r, int step, std::size_t tensor) {
    return (step % 2 == 1 && tensor == static_cast<std::size_t>(step + r) % 6) || (r == 0 && tensor == 5);
  };
  for (int p : {1, 2, 3}) {
    INFO("ranks " << p);
    std::vector<std::vector<double>> got(static_cast<std::size_t>(p));
    run_inproc(p, [&](int r, inproc_transport t) {
      auto data = data_of(r);
      linear_model m(tensor_sizes, data, 0.25);
      int step = 0;
      m.unused = [&](std::size_t tensor) { return unused(r, step, tensor); };
      auto o = small_buckets();
      o.find_unused_parameters = true;
      allreduce::trainer tr(comm_t(std::move(t)), momentum<double>(lr, mu), m, o);
      for (; step < 20; ++step) {
        const std::size_t begin = (static_cast<std::size_t>(step) * batch) % 400;
        tr.step({begin, begin + batch});
      }
      got[static_cast<std::size_t>(r)] = m.weights();
    });
    sim_options o;
    o.unused = unused;
    require_close(got[0], simulate(p, 20, o)[0], 1e-12);
    for (const auto& w : got) REQUIRE(w == got[0]);
  }

  SECTION("without the option, an unused tensor is an error naming it") {
    run_inproc(2, [&](int r, inproc_transport t) {
      auto data = data_of(r);
      linear_model m(tensor_sizes, data, 0.25);
      m.unused = [](std::size_t tensor) { return tensor == 2; };
      allreduce::trainer tr(comm_t(std::move(t)), momentum<double>(lr, mu), m, small_buckets());
      const auto refused = caught([&] { tr.step({0, batch}); });
      TCHECK(refused.what.find("never reported tensor 2") != std::string::npos);
    });
  }
}

TEST_CASE("clipping scales the averaged gradient to the serial global norm", "[allreduce]") {
  const double max_norm = 25;  // the gradient's norm runs from about 36 down to 20 here
  std::vector<double> norms;
  std::vector<std::vector<double>> got(3);
  run_inproc(3, [&](int r, inproc_transport t) {
    auto data = data_of(r);
    linear_model m(tensor_sizes, data, 0.25);
    auto o = small_buckets();
    o.clip_grad_norm = max_norm;
    allreduce::trainer tr(comm_t(std::move(t)), momentum<double>(lr, mu), m, o);
    for (int s = 0; s < 25; ++s) {
      const std::size_t begin = (static_cast<std::size_t>(s) * batch) % 400;
      const double norm = tr.step({begin, begin + batch}).grad_norm;
      if (r == 0) norms.push_back(norm);
    }
    got[static_cast<std::size_t>(r)] = m.weights();
  });
  sim_options o;
  o.clip = max_norm;
  require_close(got[0], simulate(3, 25, o)[0], 1e-12);
  for (const auto& w : got) REQUIRE(w == got[0]);
  // The bound was active in some steps and not in others, so both paths ran.
  CHECK(std::count_if(norms.begin(), norms.end(), [&](double n) { return n > max_norm; }) > 0);
  CHECK(std::count_if(norms.begin(), norms.end(), [&](double n) { return n < max_norm; }) > 0);
  // And clipping changed the result.
  REQUIRE(std::abs(got[0][0] - simulate(3, 25, sim_options{})[0][0]) > 1e-9);
}

TEST_CASE("top-k with error feedback equals the serial simulation, and density 1 the dense run", "[allreduce]") {
  for (int p : {1, 2, 3}) {
    for (double density : {0.02, 0.1, 0.3, 1.0}) {
      INFO("ranks " << p << ", density " << density);
      std::vector<std::vector<double>> got(static_cast<std::size_t>(p));
      std::vector<std::uint64_t> bytes(static_cast<std::size_t>(p));
      run_inproc(p, [&](int r, inproc_transport t) {
        auto data = data_of(r);
        linear_model m(tensor_sizes, data, 0.25);
        allreduce::trainer_options o;  // one bucket: the selection runs over the whole gradient
        o.compress = allreduce::compression::topk;
        o.topk_density = density;
        allreduce::trainer tr(comm_t(std::move(t)), momentum<double>(lr, mu), m, o);
        for (int s = 0; s < 25; ++s) {
          const std::size_t begin = (static_cast<std::size_t>(s) * batch) % 400;
          tr.step({begin, begin + batch});
        }
        got[static_cast<std::size_t>(r)] = m.weights();
        bytes[static_cast<std::size_t>(r)] = tr.stats().bytes_reduced;
      });
      sim_options o;
      o.topk_density = p > 1 ? density : 0;  // one rank has nothing to send: no compression
      require_close(got[0], simulate(p, 25, o)[0], 1e-11);
      for (const auto& w : got) REQUIRE(w == got[0]);
      if (density == 1.0) require_close(got[0], simulate(p, 25, sim_options{})[0], 1e-11);
      const auto k = static_cast<std::uint64_t>(std::ceil(density * 130));
      if (p > 1) CHECK(bytes[0] == 25 * k * (4 + 8));  // index and value per kept entry, per step
    }
  }
  // With error feedback, 10% density ends where the dense run does (at a rate where the dense
  // run converges: weights near 3.4 after 400 steps, the sparse ones within 0.01).
  sim_options dense_run, sparse_run;
  dense_run.rate = sparse_run.rate = [](std::size_t) { return 0.005; };
  sparse_run.topk_density = 0.1;
  const auto dense = simulate(2, 400, dense_run)[0], fed_back = simulate(2, 400, sparse_run)[0];
  double gap = 0;
  for (std::size_t j = 0; j < dense.size(); ++j) gap = std::max(gap, std::fabs(dense[j] - fed_back[j]));
  CHECK(gap < 0.01);
}

TEST_CASE("top-k compressor: sent plus residual is the input, NaN is sent, bad indices refused", "[allreduce]") {
  topk_compressor<float> c(6);
  const std::vector<float> g{0.5f, -3.0f, 0.25f, 2.0f, -0.125f, 1.0f};
  std::vector<std::int32_t> idx(2);
  std::vector<float> val(2);
  c.compress(g, idx, val);
  CHECK(idx == std::vector<std::int32_t>{1, 3});  // sorted by index
  CHECK(val == std::vector<float>{-3.0f, 2.0f});
  CHECK(std::vector<float>(c.residual().begin(), c.residual().end()) ==
        std::vector<float>{0.5f, 0, 0.25f, 0, -0.125f, 1.0f});
  c.compress(std::vector<float>{0.75f, 0, 0, 0, 0, std::nanf("")}, idx, val);
  CHECK(idx == std::vector<std::int32_t>{0, 5});  // 0.5 + 0.75 and the NaN
  std::vector<float> out(6, 0.0f);
  sparse_add<float>(out, std::vector<std::int32_t>{1, 3}, std::vector<float>{1, 2});
  CHECK(out[3] == 2.0f);
  REQUIRE_THROWS_AS(sparse_add<float>(out, std::vector<std::int32_t>{6}, std::vector<float>{1}), dtrain::error);
  REQUIRE_THROWS_AS(topk_count(10, 0.0), dtrain::error);

  // Against the definition, by sorting: the k largest magnitudes, ties to the lower index, on
  // inputs that mislead a sample (a block of large values, many ties, all equal, a spike).
  std::mt19937 gen(5);
  for (int trial = 0; trial < 60; ++trial) {
    const std::size_t n = 1 + gen() % 50000, k = 1 + gen() % n;
    std::vector<float> in(n);
    const int shape = trial % 4;
    for (std::size_t i = 0; i < n; ++i) {
      in[i] = shape == 0 ? std::normal_distribution<float>()(gen)
            : shape == 1 ? (i > n / 2 && i < n / 2 + n / 50 ? 100.0f + static_cast<float>(i % 3) : 0.01f)
            : shape == 2 ? static_cast<float>(static_cast<int>(gen() % 5) - 2)
                         : (i == n / 3 ? 7.0f : 1.0f);
    }
    std::vector<std::size_t> order(n);
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return std::fabs(in[a]) > std::fabs(in[b]); });
    std::vector<std::int32_t> want(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k));
    std::sort(want.begin(), want.end());
    topk_compressor<float> fresh(n);
    std::vector<std::int32_t> got(k);
    std::vector<float> got_values(k);
    fresh.compress(in, got, got_values);
    INFO("trial " << trial << " n " << n << " k " << k << " shape " << shape);
    REQUIRE(got == want);
    for (std::size_t j = 0; j < k; ++j) REQUIRE(got_values[j] == in[static_cast<std::size_t>(got[j])]);
  }
  CHECK(topk_count(130, 0.01) == 2);
}

TEST_CASE("allreduce: memory() counts the trainer's own bytes by kind, before and after it grows",
          "[allreduce]") {
  // 130 doubles (tensors 3, 40, 1, 17, 60, 9), Adam's two moments, two ranks. Buckets by hand
  // (reverse order, closing once full): default options give one of 130; small_buckets()' 80
  // bytes then 512 give {9, 60} = 69 and {17, 1, 40, 3} = 61. Top-k at density 0.1 sends
  // ceil(0.1 n) of a bucket: 13 of 130, 7 of 69 and of 61. Each figure is a closed form of these
  // sizes, not the trainer's report of itself.
  constexpr std::size_t n = 130, p = 2;
  struct layout {
    allreduce::trainer_options options;
    std::size_t largest, k;  // the largest bucket, and the most top-k entries a bucket sends
  };
  for (const layout& l : {layout{allreduce::trainer_options{}, 130, 13}, layout{small_buckets(), 69, 7}}) {
    for (const auto c : {allreduce::compression::none, allreduce::compression::fp16, allreduce::compression::bf16,
                         allreduce::compression::topk}) {
      INFO("largest bucket " << l.largest << ", compression " << static_cast<int>(c));
      std::vector<memory_use> built(p), after(p), peak(p);
      std::vector<std::size_t> state_bytes(p);
      run_inproc(static_cast<int>(p), [&](int r, inproc_transport t) {
        auto data = data_of(r);
        linear_model m(tensor_sizes, data, 0.25);
        allreduce::trainer_options o = l.options;
        o.compress = c;
        o.topk_density = 0.1;
        allreduce::trainer tr(comm_t(std::move(t)), adam<double>(1e-2), m, o);
        const auto i = static_cast<std::size_t>(r);
        built[i] = tr.memory();
        tr.accumulate({0, batch});
        tr.step({batch, 2 * batch});
        after[i] = tr.memory();
        peak[i] = tr.peak_memory();
        state_bytes[i] = tr.updater().state().size() * sizeof(double);
      });
      const std::size_t grown = c == allreduce::compression::topk ? n * 8 + l.k * (p + 1) * (4 + 8)  // residuals, pairs
                                : c == allreduce::compression::none ? 0
                                                                    : l.largest * 2;  // 16-bit packing
      for (std::size_t r = 0; r < p; ++r) {
        CHECK(built[r].parameters == 0);  // a double model's parameters are the model's own
        CHECK(built[r].gradients == 0);
        CHECK(built[r].optimizer_state == n * 16);
        CHECK(state_bytes[r] == n * 16);  // what the updater holds, not only what the trainer says
        CHECK(built[r].buffers == l.largest * 8);  // the bucket it packs
        CHECK(after[r].gradients == n * 8);  // the sum `accumulate` keeps
        CHECK(after[r].buffers == l.largest * 8 + grown);
        CHECK(after[r].device == 0);
        CHECK(after[r].total() == n * 16 + n * 8 + l.largest * 8 + grown);
        CHECK(peak[r].total() == after[r].total());
      }
    }
  }
}

namespace {

// An in-process rank that says whether its host has cores to spare, as a process transport does
// (progress.hpp).
struct spare_inproc : inproc_transport {
  spare_inproc(inproc_transport t, bool spare) : inproc_transport(std::move(t)), spare_(spare) {}
  bool spare_cores() const noexcept { return spare_; }
  bool spare_;
};

}  // namespace

TEST_CASE("allreduce: the automatic first bucket cuts a small model only where every rank has cores to spare",
          "[allreduce]") {
  using allreduce::automatic_first_bucket, allreduce::first_bucket_capacity;
  constexpr std::size_t KiB = 1024, MiB = KiB * KiB;
  CHECK(first_bucket_capacity(automatic_first_bucket, 940 * KiB, false) == MiB);
  CHECK(first_bucket_capacity(automatic_first_bucket, 940 * KiB, true) == 940 * KiB / 8);
  CHECK(first_bucket_capacity(automatic_first_bucket, 100 * KiB, true) == 64 * KiB);
  CHECK(first_bucket_capacity(automatic_first_bucket, 100 * MiB, true) == MiB);
  CHECK(first_bucket_capacity(80, 940 * KiB, true) == 80);
  // 130,000 doubles in tensors of 100,000, 20,000 and 10,000 (1,040,000 bytes, under 1 MiB). With
  // cores to spare on both ranks the first bucket (130,000 bytes) closes after the last two
  // tensors; where either rank has none, both plan DDP's one bucket. The weights after two steps
  // are the same, bit for bit, however the buckets were cut.
  const std::vector<std::size_t> sizes{100000, 20000, 10000};
  std::vector<double> first_weights;
  for (const auto& [a, b] : {std::pair{true, true}, {true, false}, {false, true}, {false, false}}) {
    INFO("cores to spare: rank 0 " << a << ", rank 1 " << b);
    std::vector<std::vector<std::size_t>> cut(2);  // per rank: the tensors of each bucket
    std::vector<std::vector<double>> weights(2);
    run_inproc(2, [&](int r, inproc_transport t) {
      const regression_data data(130000, 16, 7u + static_cast<unsigned>(r));
      linear_model m(sizes, data, 0.25);
      allreduce::trainer tr(communicator<spare_inproc>(spare_inproc(std::move(t), r == 0 ? a : b)),
                            momentum<double>(lr, mu), m);
      for (const auto& bucket : tr.plan().buckets()) cut[static_cast<std::size_t>(r)].push_back(bucket.tensors.size());
      tr.step({0, 8});
      tr.step({8, 16});
      weights[static_cast<std::size_t>(r)] = m.weights();
    });
    const std::vector<std::size_t> want = a && b ? std::vector<std::size_t>{2, 1} : std::vector<std::size_t>{3};
    CHECK(cut[0] == want);
    CHECK(cut[1] == want);
    REQUIRE(weights[0] == weights[1]);
    if (first_weights.empty()) first_weights = weights[0];
    CHECK(weights[0] == first_weights);
  }
  // Rank 0 automatic, rank 1 asking for DDP's 1 MiB, both with cores to spare: both take part in
  // the start-up question alike, then their plans differ, and every rank is told so (no hang).
  std::vector<std::string> told(2);
  run_inproc(2, [&](int r, inproc_transport t) {
    const regression_data data(130000, 16, 7u + static_cast<unsigned>(r));
    linear_model m(sizes, data, 0.25);
    allreduce::trainer_options o;
    if (r == 1) o.first_bucket_bytes = MiB;
    try {
      allreduce::trainer tr(communicator<spare_inproc>(spare_inproc(std::move(t), true)), momentum<double>(lr, mu),
                            m, o);
    } catch (const dtrain::error& e) {
      told[static_cast<std::size_t>(r)] = e.code() == errc::invalid_argument ? e.what() : "";
    }
  });
  for (const auto& text : told) {
    CHECK(text.find("ranks disagree on the model or trainer options") != std::string::npos);
    CHECK(text.find("their buckets (first_bucket_bytes, bucket_bytes): rank 0 has digest") != std::string::npos);
  }
}
