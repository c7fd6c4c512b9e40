// Sharded checkpoints: a job resumed from its set continues bit for bit; a set written on 4
// ranks loads on 2 and 3 and, saved again there, brings the 4-rank job back bit for bit (the
// slices went through the other cut); damaged, incomplete, mixed and foreign sets are refused
// on every rank, naming the file, and change nothing.

#include <atomic>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <string>
#include <type_traits>
#include <unistd.h>
#include <utility>
#include <vector>

#include "../allreduce/checks.hpp"  // sharded_buckets
#include "../allreduce/linear_model.hpp"
#include "../allreduce/simulation.hpp"
#include "../catch.hpp"
#include "../support/files.hpp"
#include "dtrain/collective/communicator.hpp"
#include "dtrain/sharded/trainer.hpp"
#include "dtrain/sharded/unit_trainer.hpp"
#include "dtrain/transport/inproc.hpp"
#include "dtrain/updater/adam.hpp"
#include "unit_model.hpp"

using namespace dtrain;
using namespace dtrain::testing;
using comm_t = ring<inproc_transport>;

namespace {

// What one run of a job does: load a set first (or not), take steps from step `from`, save.
struct segment {
  int ranks = 4;
  int from = 0, steps = 0;
  std::string load, save;
};

// Runs `s` with a trainer of `Stage` (stage 3 on the unit model, else the linear model) and
// Adam; returns every rank's weights afterwards and the errors its load raised, by rank.
template <class Stage>
std::pair<std::vector<std::vector<double>>, std::vector<std::string>> run(const segment& s,
                                                                          bool other_model = false) {
  const auto P = static_cast<std::size_t>(s.ranks);
  std::vector<std::vector<double>> weights(P);
  std::vector<std::string> errors(P);
  run_inproc(s.ranks, [&](int r, inproc_transport t) {
    const auto R = static_cast<std::size_t>(r);
    auto data = data_of(r);
    auto go = [&](auto& tr, auto&& weights_of) {
      if (!s.load.empty()) {
        try {
          tr.load(s.load);
        } catch (const error& e) {
          errors[R] = e.what();
          if (tr.steps() != 0) errors[R] += " [the failed load changed the trainer]";
        }
      }
      for (int k = s.from; k < s.from + s.steps; ++k) {
        const std::size_t begin = (static_cast<std::size_t>(k) * batch) % 400;
        tr.step({begin, begin + batch});
      }
      if (!s.save.empty()) tr.save(s.save);
      weights[R] = weights_of();
    };
    if constexpr (std::is_same_v<Stage, sharded::zero3>) {
      auto sizes = unit_sizes;
      if (other_model) sizes.back() = {8, 1};
      unit_linear_model m(sizes, data, 0.25);
      sharded::trainer<comm_t, Stage, adam<double>, unit_linear_model> tr(comm_t(std::move(t)), adam<double>(0.01), m);
      go(tr, [&] {
        std::vector<double> w;
        for (std::size_t u = 0; u < sizes.size(); ++u) {
          const auto whole = tr.unit_parameters(u);
          w.insert(w.end(), whole.begin(), whole.end());
        }
        return w;
      });
    } else {
      std::vector<std::size_t> sizes = tensor_sizes;
      if (other_model) sizes = {3, 40, 1, 17, 59, 10};
      linear_model m(sizes, data, 0.25);
      sharded::trainer<comm_t, Stage, adam<double>, linear_model> tr(comm_t(std::move(t)), adam<double>(0.01), m,
                                                                     sharded_buckets());
      go(tr, [&] { return m.weights(); });
    }
  });
  return {weights, errors};
}

}  // namespace

TEMPLATE_TEST_CASE("a sharded job resumes bit for bit, on its own and on another number of ranks", "[sharded]",
                   sharded::zero1, sharded::zero2, sharded::zero3) {
  temp_dir dir;
  const std::string a = dir.path + "/a", b = dir.path + "/b", c = dir.path + "/c";
  const auto whole = run<TestType>({4, 0, 20, "", ""}).first;
  const auto first = run<TestType>({4, 0, 10, "", a}).first;
  const auto resumed = run<TestType>({4, 10, 10, a, ""}).first;
  REQUIRE(resumed == whole);  // every rank, every bit
  for (int ranks : {2, 3}) {
    INFO("through " << ranks << " ranks");
    // Loaded there, the weights are the 4 ranks' (stages 1, 2 gather them into the model).
    const auto there = run<TestType>({ranks, 10, 0, a, b}).first;
    for (const auto& w : there) REQUIRE(w == first[0]);
    const auto back = run<TestType>({4, 10, 10, b, ""}).first;
    REQUIRE(back == whole);
  }
  // Two hops: 4 -> 3 -> 2 -> 4.
  run<TestType>({3, 10, 0, a, b});
  run<TestType>({2, 10, 0, b, c});
  REQUIRE(run<TestType>({4, 10, 10, c, ""}).first == whole);
}

TEMPLATE_TEST_CASE("damaged, incomplete, mixed and foreign sets are refused on every rank, naming the file",
                   "[sharded]", sharded::zero2, sharded::zero3) {
  temp_dir dir;
  const std::string a = dir.path + "/a", later = dir.path + "/later";
  run<TestType>({4, 0, 10, "", a});
  run<TestType>({4, 0, 12, "", later});
  auto refused = [&](int ranks, const std::string& text, bool other_model = false) {
    const auto errors = run<TestType>({ranks, 10, 0, a, ""}, other_model).second;
    for (std::size_t r = 0; r < errors.size(); ++r) {
      INFO("rank " << r << ": " << errors[r]);
      CHECK(errors[r].find(text) != std::string::npos);
      CHECK(errors[r].find("changed the trainer") == std::string::npos);
    }
  };
  refused(3, "holds tensors of sizes", true);  // another model
  const std::string shard = sharded::shard_path(a, 1, 4);
  std::filesystem::copy_file(shard, dir.path + "/kept");
  std::filesystem::copy_file(sharded::shard_path(later, 1, 4), shard,
                             std::filesystem::copy_options::overwrite_existing);
  refused(2, "is from step 12; its set's manifest says step 10");  // a shard of another save
  flip_bit(shard, 100);
  refused(3, "shard-1-of-4 is corrupt");
  std::filesystem::remove(shard);
  refused(4, "cannot open " + shard);  // a shard missing
  std::filesystem::copy_file(dir.path + "/kept", shard);
  REQUIRE(run<TestType>({3, 10, 0, a, ""}).second == std::vector<std::string>(3));  // whole again: loads
  std::filesystem::remove(sharded::manifest_path(a));
  refused(3, "cannot open " + sharded::manifest_path(a));  // no manifest: the save did not finish
}

TEST_CASE("a save completes on every rank or on none: no manifest when one rank cannot write", "[sharded]") {
  temp_dir dir;
  const std::string a = dir.path + "/a";
  std::filesystem::create_directories(sharded::shard_path(a, 2, 4));  // rank 2's file cannot be written
  std::vector<std::string> errors(4);
  run_inproc(4, [&](int r, inproc_transport t) {
    auto data = data_of(r);
    linear_model m(tensor_sizes, data, 0.25);
    sharded::trainer<comm_t, sharded::zero2, adam<double>, linear_model> tr(comm_t(std::move(t)), adam<double>(0.01),
                                                                            m, sharded_buckets());
    tr.step({0, batch});
    try {
      tr.save(a);
    } catch (const error& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  CHECK(!std::filesystem::exists(sharded::manifest_path(a)));
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r << ": " << errors[static_cast<std::size_t>(r)]);
    CHECK(errors[static_cast<std::size_t>(r)].find(r == 2 ? "shard-2-of-4" : "rank 2 could not write its shard") !=
          std::string::npos);
  }
}

TEST_CASE("a shard of another updater, cut or rank, or one short of its values, is refused naming it", "[sharded]") {
  // The set of a 130-parameter model in buckets of 69 and 61 with Adam (2 state values each),
  // written on one rank and loaded as rank 0 of 2: slices of 35 + 31 = 66 parameters.
  temp_dir dir;
  const std::string a = dir.path + "/a";
  const sharded::shard_identity adam_id{"adam", 2, 8, {69, 61}, {3, 40, 1, 17, 60, 9}};
  std::vector<double> whole(130, 1.0), whole_state(260, 0.5), mine(66), mine_state(132);
  auto load = [&](const sharded::shard_identity& id) {
    mine_state.assign(mine.size() * id.state_slots, 0.0);
    return sharded::load_shards<double>(a, 0, 2, id, std::span<double>(mine), std::span<double>(mine_state));
  };
  auto refused = [&](const sharded::shard_identity& id, const std::string& text) {
    try {
      load(id);
      FAIL("it loaded");
    } catch (const error& e) {
      INFO(e.what());
      CHECK(e.code() == make_error_code(errc::bad_data));
      CHECK(std::string(e.what()).find(text) != std::string::npos);
    }
  };
  sharded::save_shard<double>(a, 0, 1, adam_id, {5, 0.01}, whole, whole_state);
  sharded::save_manifest(a, 1, 5);
  REQUIRE(load(adam_id).steps == 5);
  auto momentum_id = adam_id;
  momentum_id.updater = "momentum";
  momentum_id.state_slots = 1;
  refused(momentum_id, "was written with updater adam");
  auto other_cut = adam_id;
  other_cut.parts = {43, 18, 60, 9};  // stage 3's units of the same model
  refused(other_cut, "is cut into parts of [69,61] elements");
  // A set of 2: rank 1's place taken by a copy of rank 0's shard, then by a short one.
  sharded::save_shard<double>(a, 0, 2, adam_id, {5, 0.01}, std::span<const double>(whole).first(66),
                              std::span<const double>(whole_state).first(132));
  sharded::save_manifest(a, 2, 5);
  std::filesystem::copy_file(sharded::shard_path(a, 0, 2), sharded::shard_path(a, 1, 2));
  refused(adam_id, "is rank 0 of 2; the manifest wants rank 1 of 2");
  sharded::save_shard<double>(a, 1, 2, adam_id, {5, 0.01}, std::span<const double>(whole).first(60),
                              std::span<const double>(whole_state).first(132));
  refused(adam_id, "is truncated or holds more than its header says");
  // Buffers the caller sized for another layout are refused before anything is written.
  std::vector<double> small(65);
  CHECK_THROWS_WITH(sharded::load_shards<double>(a, 0, 2, adam_id, std::span<double>(small),
                                                 std::span<double>(mine_state)),
                    Catch::Contains("buffers of 65 and 132 values"));
}
