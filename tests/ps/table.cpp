// The server-side table: lazy, order-independent initialisation; per-key updater state across
// requests (against a hand-written reference); summation mode; staleness reaching the updater;
// size checks; and the flat key map underneath.

#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "../catch.hpp"
#include "dtrain/detail/flat_map.hpp"
#include "dtrain/ps/table.hpp"
#include "dtrain/updater/momentum.hpp"
#include "dtrain/updater/sgd.hpp"
#include "dtrain/updater/staleness_aware.hpp"

using namespace dtrain;
using namespace dtrain::ps;

TEST_CASE("flat key map finds what was inserted, and nothing else", "[ps][table]") {
  dtrain::detail::flat_key_map m;
  std::mt19937_64 gen(1);
  std::map<std::uint64_t, std::uint32_t> reference;
  for (std::uint32_t i = 0; i < 20000; ++i) {
    const std::uint64_t k = i % 3 == 0 ? i : gen();  // dense runs and random keys
    if (reference.count(k)) continue;
    m.insert(k, i);
    reference[k] = i;
  }
  CHECK(m.size() == reference.size());
  for (const auto& [k, v] : reference) REQUIRE(m.find(k) == v);
  for (int i = 0; i < 1000; ++i) {
    const std::uint64_t k = gen();
    if (!reference.count(k)) CHECK(m.find(k) == dtrain::detail::flat_key_map::none);
  }
}

TEST_CASE("keys are created on first touch, the same whatever the order", "[ps][table]") {
  uniform_initializer init{0.5, 42};
  table<float, sgd<float>, uniform_initializer> a(sgd<float>(0.1), init), b(sgd<float>(0.1), init);
  std::vector<key_type> keys{3, 17, 1u << 20, 99};
  std::vector<key_type> reversed(keys.rbegin(), keys.rend());
  std::vector<float> va(keys.size() * 4), vb(keys.size() * 4);
  a.pull(keys, va, 4);
  b.pull(reversed, vb, 4);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    for (std::size_t j = 0; j < 4; ++j) {
      CHECK(va[i * 4 + j] == vb[(keys.size() - 1 - i) * 4 + j]);
      CHECK(std::fabs(va[i * 4 + j]) <= 0.5f);
    }
  }
  CHECK(va[0] != va[1]);
  CHECK(a.size() == 4);
  CHECK(a.parameters() == 16);
  table<float, sgd<float>> zeros(sgd<float>(0.1));
  std::vector<float> z(2, 1.0f);
  zeros.pull(std::vector<key_type>{7, 8}, z, 1);
  CHECK(z == std::vector<float>{0.0f, 0.0f});
}

TEST_CASE("each key keeps its own updater state across requests", "[ps][table]") {
  const double lr = 0.1, mu = 0.9;
  table<double, momentum<double>> t(momentum<double>(lr, mu));
  std::map<key_type, std::pair<double, double>> ref;  // key -> (w, v)
  std::mt19937 gen(2);
  std::uniform_int_distribution<int> pick(0, 30);
  std::normal_distribution<double> g01;
  for (int round = 0; round < 200; ++round) {
    std::vector<key_type> keys;
    for (int i = 0; i < 5; ++i) keys.push_back(static_cast<key_type>(pick(gen)) * 1000003u);
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    std::vector<double> g(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) {
      g[i] = g01(gen);
      auto& [w, v] = ref[keys[i]];
      v = mu * v + g[i];
      w -= lr * v;
    }
    t.push(keys, g, 1);
  }
  std::vector<key_type> all;
  for (const auto& [k, wv] : ref) all.push_back(k);
  std::vector<double> got(all.size());
  t.pull(all, got, 1);
  for (std::size_t i = 0; i < all.size(); ++i) CHECK(got[i] == Approx(ref[all[i]].first).epsilon(1e-12));
  CHECK(t.pushes() == 200);
}

TEST_CASE("summation mode adds pushed values, staleness reaches the updater", "[ps][table]") {
  table<float, sgd<float>> sum(sgd<float>(0.1), {}, apply_mode::sum);
  std::vector<key_type> keys{1, 2};
  sum.push(keys, std::vector<float>{1, 2, 3, 4}, 2);
  sum.push(keys, std::vector<float>{1, 1, 1, 1}, 2);
  std::vector<float> out(4);
  sum.pull(keys, out, 2);
  CHECK(out == std::vector<float>{2, 3, 4, 5});

  table<double, staleness_aware<sgd<double>>> stale(staleness_aware<sgd<double>>(sgd<double>(1.0)));
  std::vector<key_type> one{5};
  stale.push(one, std::vector<double>{4.0}, 1, step_info{4, 1.0});  // lr / 4
  std::vector<double> w(1);
  stale.pull(one, w, 1);
  CHECK(w[0] == Approx(-1.0));
}

TEST_CASE("sizes that disagree are refused before anything changes", "[ps][table]") {
  table<float, sgd<float>> t(sgd<float>(0.1));
  std::vector<key_type> keys{1, 2};
  CHECK_THROWS_WITH(t.push(keys, std::vector<float>{1, 2, 3}, 2), Catch::Contains("2 keys of length 2 but 3 values"));
  t.push(keys, std::vector<float>{1, 2, 3, 4}, 2);
  volatile std::size_t n = 5;  // opaque to GCC, which otherwise warns about the refused copy
  std::vector<float> five(n);
  CHECK_THROWS_WITH(t.pull(keys, five, 3), Catch::Contains("2 keys of length 3 but 5 values"));
  std::vector<float> six(n + 1);
  CHECK_THROWS_WITH(t.pull(keys, six, 3), Catch::Contains("key 1 holds 2 values, not 3"));
}

TEST_CASE("push_pull is a push then a pull, resolved key lists give the same results", "[ps][table]") {
  // Three tables driven alike: push then pull (the reference), fused push_pull, and push_pull
  // through a resolved key list reused across rounds (key caching), with momentum state.
  const double lr = 0.1, mu = 0.9;
  table<double, momentum<double>> separate(momentum<double>(lr, mu)), fused(momentum<double>(lr, mu)),
      cached(momentum<double>(lr, mu));
  const std::vector<key_type> keys{3, 9, 27, 81, 243};
  resolved_keys resolved;
  std::mt19937 gen(3);
  std::normal_distribution<double> g01;
  for (int round = 0; round < 50; ++round) {
    std::vector<double> g(keys.size() * 2);
    for (auto& x : g) x = g01(gen);
    std::vector<double> a(g.size()), b(g.size()), c(g.size());
    separate.push(keys, g, 2);
    separate.pull(keys, a, 2);
    fused.push_pull(keys, g, b, 2);
    cached.push_pull(keys, g, c, 2, {}, &resolved);
    REQUIRE(resolved.slots.size() == keys.size());
    CHECK(a == b);
    CHECK(a == c);
  }
  std::vector<double> out(keys.size() * 2), again(out.size());
  separate.pull(keys, out, 2);
  cached.pull(keys, again, 2, &resolved);
  CHECK(out == again);
  // A resolved list does not skip the length check: resolving for another length refuses.
  resolved_keys other;
  std::vector<double> wrong(keys.size() * 3);
  CHECK_THROWS_WITH(cached.pull(keys, wrong, 3, &other), Catch::Contains("key 3 holds 2 values, not 3"));
  CHECK(other.slots.empty());
}
