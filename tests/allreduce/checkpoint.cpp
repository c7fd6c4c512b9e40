// The allreduce trainer's checkpoints: a job resumed mid-epoch from its ranks' files ends
// bit-identical to the uninterrupted job (momentum and Adam, whose per-tensor step count the
// file carries); another world size, model, updater or options is refused naming the
// difference; a corrupt or truncated file is refused on every rank, and nothing changes.

#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "../catch.hpp"
#include "dtrain/allreduce/trainer.hpp"
#include "dtrain/collective/communicator.hpp"
#include "dtrain/transport/group.hpp"
#include "dtrain/transport/inproc.hpp"
#include "dtrain/updater/adam.hpp"
#include "dtrain/updater/momentum.hpp"
#include "../support/files.hpp"
#include "../support/thread_checks.hpp"
#include "linear_model.hpp"
#include "simulation.hpp"

using namespace dtrain;
using namespace dtrain::testing;
using group_ring = ring<process_group<inproc_transport>>;

namespace {

std::string file_of(const std::string& dir, int r) { return dir + "/rank" + std::to_string(r) + ".ckpt"; }

allreduce::trainer_options options() {
  allreduce::trainer_options o;
  o.first_bucket_bytes = 8 * 10;
  o.bucket_bytes = 8 * 64;
  o.learning_rate = [](std::size_t step) { return 0.02 / (1.0 + 0.05 * static_cast<double>(step)); };
  return o;
}

// Steps [first, last) of the job on this rank; batches at (step * batch) % 400.
template <class Trainer>
void run_steps(Trainer& tr, std::size_t first, std::size_t last) {
  for (std::size_t k = first; k < last; ++k) {
    const std::size_t begin = (k * batch) % 400;
    tr.step({begin, begin + batch});
  }
}

// Trains `steps` steps on p ranks; with `save_at`, saves every rank's file there, then builds
// fresh models and trainers (other initial weights), loads and finishes. Returns the weights.
template <class Updater>
std::vector<std::vector<double>> job(int p, std::size_t steps, Updater proto, const std::string& dir,
                                     std::size_t save_at = 0) {
  std::vector<std::vector<double>> out(static_cast<std::size_t>(p));
  run_inproc(p, [&](int r, inproc_transport t) {
    process_group world(std::move(t));
    auto data = data_of(r);
    linear_model m(tensor_sizes, data, 0.25);
    auto first = world.form(rank_list::range(0, p), "first");
    allreduce::trainer tr(group_ring(*first), proto, m, options());
    if (save_at == 0) {
      run_steps(tr, 0, steps);
      out[static_cast<std::size_t>(r)] = m.weights();
      return;
    }
    run_steps(tr, 0, save_at);
    // Mid-epoch: the next sample is save_at * batch into the 400 of epoch 0.
    tr.save(file_of(dir, r), {0, save_at * batch % 400});
    linear_model fresh(tensor_sizes, data, -3.0);
    auto second = world.form(rank_list::range(0, p), "second");
    allreduce::trainer resumed(group_ring(*second), proto, fresh, options());
    const auto at = resumed.load(file_of(dir, r));
    TCHECK(at.epoch == 0);
    TCHECK(at.next == save_at * batch % 400);
    TCHECK(resumed.steps() == save_at);
    run_steps(resumed, save_at, steps);
    out[static_cast<std::size_t>(r)] = fresh.weights();
  });
  return out;
}

}  // namespace

TEST_CASE("a job resumed mid-epoch ends bit-identical to the uninterrupted job", "[allreduce][checkpoint]") {
  temp_dir dir;
  for (int p : {1, 2, 3}) {
    INFO("ranks " << p);
    const auto straight = job(p, 30, momentum<double>(lr, mu), dir.path);
    const auto resumed = job(p, 30, momentum<double>(lr, mu), dir.path, 13);
    CHECK(resumed == straight);
    // Adam: its moments and the per-tensor step count (the trainer's) must both come back.
    CHECK(job(p, 30, adam<double>(0.01), dir.path, 17) == job(p, 30, adam<double>(0.01), dir.path));
  }
  // The comparison can fail: a run that resumes without loading differs.
  CHECK(job(2, 30, adam<double>(0.01), dir.path, 17) != job(2, 31, adam<double>(0.01), dir.path));
}

TEST_CASE("a checkpoint of another world size, model, updater or options is refused, naming it",
          "[allreduce][checkpoint]") {
  temp_dir dir;
  // Two ranks save after 5 steps.
  run_inproc(2, [&](int r, inproc_transport t) {
    auto data = data_of(r);
    linear_model m(tensor_sizes, data, 0.25);
    process_group world(std::move(t));
    allreduce::trainer tr(group_ring(world), momentum<double>(lr, mu), m, options());
    run_steps(tr, 0, 5);
    tr.save(file_of(dir.path, r));
  });
  auto refused_on_every_rank = [&](int p, auto make_trainer, const std::string& text) {
    std::vector<std::string> messages(static_cast<std::size_t>(p));
    run_inproc(p, [&](int r, inproc_transport t) {
      auto data = data_of(r);
      process_group world(std::move(t));
      make_trainer(world, data, [&](auto& tr, auto& model) {
        const auto before = model.weights();
        try {
          tr.load(file_of(dir.path, r % 2));
        } catch (const dtrain::error& e) {
          messages[static_cast<std::size_t>(r)] = e.what();
          TCHECK(e.code() == errc::bad_data);
        }
        TCHECK(model.weights() == before);  // nothing changed
        TCHECK(tr.steps() == 0);
      });
    });
    std::string all;
    for (const auto& m : messages) all += m + "\n";
    INFO(all);
    CHECK(messages[0].find(text) != std::string::npos);
    for (const auto& m : messages) CHECK(!m.empty());
  };
  auto with_momentum = [](std::vector<std::size_t> sizes, allreduce::trainer_options o) {
    return [=](auto& world, auto& data, auto body) {
      linear_model m(sizes, data, 0.25);
      allreduce::trainer tr(group_ring(world), momentum<double>(lr, mu), m, o);
      body(tr, m);
    };
  };
  refused_on_every_rank(3, with_momentum(tensor_sizes, options()), "a job of 2 ranks; this job has 3");
  auto other = tensor_sizes;
  std::swap(other[0], other[1]);
  refused_on_every_rank(2, with_momentum(other, options()),
                        "holds tensors of sizes [3,40,1,17,60,9]; this model's are [40,3,");
  auto compressed = options();
  compressed.compress = allreduce::compression::bf16;
  refused_on_every_rank(2, with_momentum(tensor_sizes, compressed), "other compression or local SGD options");
  refused_on_every_rank(2, [](auto& world, auto& data, auto body) {
    linear_model m(tensor_sizes, data, 0.25);
    allreduce::trainer tr(group_ring(world), adam<double>(0.01), m, options());
    body(tr, m);
  }, "updater momentum on 8-byte values; this trainer runs adam");

  SECTION("a corrupt or truncated file on one rank fails every rank, and nothing changes") {
    flip_bit(file_of(dir.path, 1), 200);  // in rank 1's parameters
    refused_on_every_rank(2, with_momentum(tensor_sizes, options()), "rank 1 could not load its checkpoint");
    std::filesystem::resize_file(file_of(dir.path, 1), 100);
    refused_on_every_rank(2, with_momentum(tensor_sizes, options()), "rank 1 could not load");
  }
}

TEST_CASE("during local SGD each rank needs its own file", "[allreduce][checkpoint]") {
  temp_dir dir;
  auto o = options();
  o.average_every = 4;
  std::vector<std::string> refused(2);
  run_inproc(2, [&](int r, inproc_transport t) {
    auto data = data_of(r);
    linear_model m(tensor_sizes, data, 0.25);
    process_group world(std::move(t));
    auto first = world.form(rank_list::range(0, 2), "first");
    allreduce::trainer tr(group_ring(*first), momentum<double>(lr, mu), m, o);
    run_steps(tr, 0, 6);  // mid-period: the replicas differ
    tr.save(file_of(dir.path, r));
    auto second = world.form(rank_list::range(0, 2), "second");
    linear_model fresh(tensor_sizes, data, 0.25);
    allreduce::trainer other(group_ring(*second), momentum<double>(lr, mu), fresh, o);
    try {
      other.load(file_of(dir.path, 1 - r));  // the other rank's replica
    } catch (const dtrain::error& e) {
      refused[static_cast<std::size_t>(r)] = e.what();
    }
  });
  CHECK(refused[0].find("holds rank 1's own replica (saved during local SGD); this is rank 0") != std::string::npos);
  CHECK(refused[1].find("holds rank 0's own replica") != std::string::npos);
}
