// sharded::whole_model: a unit model held whole trains under the allreduce trainer and stages 1
// and 2 as it does under stage 3, against the serial simulation; it reports each unit's tensors
// ready when the unit's backward is done; a pass asking for a tensor it lacks is an error.

#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../allreduce/checks.hpp"  // require_close
#include "../allreduce/simulation.hpp"
#include "../catch.hpp"
#include "dtrain/allreduce/trainer.hpp"
#include "dtrain/collective/communicator.hpp"
#include "dtrain/sharded/trainer.hpp"
#include "dtrain/sharded/whole_model.hpp"
#include "dtrain/transport/inproc.hpp"
#include "dtrain/updater/momentum.hpp"
#include "unit_model.hpp"

using namespace dtrain;
using namespace dtrain::testing;
using comm_t = ring<inproc_transport>;
using whole_t = sharded::whole_model<unit_linear_model>;
static_assert(model<whole_t>);

namespace {

// Each rank's weights after 30 momentum steps of `Trainer` on the unit model held whole.
template <class MakeTrainer>
std::vector<std::vector<double>> train_whole(int p, MakeTrainer make) {
  std::vector<std::vector<double>> out(static_cast<std::size_t>(p));
  run_inproc(p, [&](int r, inproc_transport t) {
    auto data = data_of(r);
    unit_linear_model units(unit_sizes, data, r == 0 ? 0.25 : 1.0 + r);  // the root's start must win
    whole_t whole(units);
    auto tr = make(comm_t(std::move(t)), whole);
    for (int k = 0; k < 30; ++k) {
      const std::size_t begin = (static_cast<std::size_t>(k) * batch) % 400;
      tr.step({begin, begin + batch});
    }
    auto& w = out[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < whole.tensor_count(); ++i) {
      const auto x = whole.parameters(i);
      w.insert(w.end(), x.begin(), x.end());
    }
  });
  return out;
}

}  // namespace

TEST_CASE("a unit model held whole trains under the allreduce trainer and stages 1 and 2 as the simulation",
          "[sharded]") {
  const momentum<double> rule(lr, mu);
  for (int p : {1, 2, 3, 5}) {
    INFO("ranks " << p);
    const auto want = simulate(p, 30, 1, 0)[0];
    const auto allreduce =
        train_whole(p, [&](comm_t c, whole_t& m) { return allreduce::trainer(std::move(c), rule, m); });
    const auto zero1 = train_whole(p, [&](comm_t c, whole_t& m) {
      return sharded::trainer<comm_t, sharded::zero1, momentum<double>, whole_t>(std::move(c), rule, m);
    });
    const auto zero2 = train_whole(p, [&](comm_t c, whole_t& m) {
      return sharded::trainer<comm_t, sharded::zero2, momentum<double>, whole_t>(std::move(c), rule, m);
    });
    for (const auto* got : {&allreduce, &zero1, &zero2}) {
      require_close((*got)[0], want, 1e-12);
      for (const auto& w : *got) REQUIRE(w == (*got)[0]);
    }
  }
}

TEST_CASE("whole_model reports a unit's tensors ready at its backward_done, last unit first", "[sharded]") {
  auto data = data_of(0);
  unit_linear_model units(unit_sizes, data, 0.5);
  whole_t whole(units);
  REQUIRE(whole.tensor_count() == 6);  // {3, 40}, {1, 17}, {60}, {9}
  for (std::size_t i = 0; i < whole.tensor_count(); ++i) {
    for (double x : whole.parameters(i)) REQUIRE(x == 0.5);  // initialize's value, every tensor
  }
  std::vector<std::pair<std::size_t, std::size_t>> seen;  // (tensor, units done with backward so far)
  std::size_t done = 0;
  units.on = [&](const std::string& event, std::size_t) { done += event == "backward_done" ? 1 : 0; };
  auto record = [&](std::size_t i) { seen.emplace_back(i, done); };
  whole.forward_backward({0, batch}, gradient_ready(record));
  // Unit 3 (tensor 5) is reported inside its backward_done, before the model's hook counts it.
  const std::vector<std::pair<std::size_t, std::size_t>> want{{5, 0}, {4, 1}, {2, 2}, {3, 2}, {0, 3}, {1, 3}};
  REQUIRE(seen == want);
}

TEST_CASE("whole_model refuses a pass that asks for a unit or tensor it does not have", "[sharded]") {
  auto data = data_of(0);
  unit_linear_model wider({{3, 40}, {1, 17}, {60}, {9}, {4}}, data, 0.5);
  auto none = [](std::size_t) {};
  // A model that declares 4 units and runs `wider`'s 5: the fifth is not there.
  struct mismatched {
    using value_type = double;
    using batch_type = std::pair<std::size_t, std::size_t>;
    unit_linear_model* pass;
    std::size_t unit_count() const noexcept { return 4; }
    std::vector<std::size_t> unit_tensors(std::size_t u) const { return unit_sizes[u]; }
    void initialize(std::size_t, std::size_t, std::span<double> w) { for (auto& x : w) x = 0; }
    double forward_backward(const batch_type& b, unit_access<double>& a) { return pass->forward_backward(b, a); }
  } odd{&wider};
  sharded::whole_model<mismatched> holder(odd);
  std::size_t elements = 0;  // what it holds: the declared units' parameters and gradients
  for (std::size_t u = 0; u < 4; ++u) {
    for (const std::size_t n : unit_sizes[u]) elements += n;
  }
  CHECK(holder.bytes() == 2 * elements * sizeof(double));
  REQUIRE_THROWS_WITH(holder.forward_backward({0, batch}, gradient_ready(none)),
                      Catch::Contains("asked for unit 4's tensor 0, which it does not have"));
  // A unit declared with one tensor fewer than its pass uses: tensor 1 of unit 0 would be unit
  // 1's first tensor, read in silence, without the check.
  unit_linear_model same(unit_sizes, data, 0.5);
  struct fewer {
    using value_type = double;
    using batch_type = std::pair<std::size_t, std::size_t>;
    unit_linear_model* pass;
    std::size_t unit_count() const noexcept { return unit_sizes.size(); }
    std::vector<std::size_t> unit_tensors(std::size_t u) const {
      return u == 0 ? std::vector<std::size_t>{unit_sizes[0][0]} : unit_sizes[u];
    }
    void initialize(std::size_t, std::size_t, std::span<double> w) { for (auto& x : w) x = 0; }
    double forward_backward(const batch_type& b, unit_access<double>& a) { return pass->forward_backward(b, a); }
  } short_unit{&same};
  sharded::whole_model<fewer> short_holder(short_unit);
  REQUIRE_THROWS_WITH(short_holder.forward_backward({0, batch}, gradient_ready(none)),
                      Catch::Contains("asked for unit 0's tensor 1, which it does not have"));
}
