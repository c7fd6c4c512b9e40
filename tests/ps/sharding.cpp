// Sharding: range shards cover the key space exactly for any server count, consistent hashing
// balances and moves few keys when a server joins, key partitions keep every key once, and dense
// tensors are sliced and spread.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "../catch.hpp"
#include "dtrain/ps/sharding.hpp"

using namespace dtrain;
using namespace dtrain::ps;
using u128 = dtrain::ps::detail::uint128;

TEST_CASE("range sharding covers the key space exactly, sizes within one key", "[ps][sharding]") {
  for (key_type space : {key_type{0}, key_type{1} << 24, key_type{1000003}, key_type{7}}) {
    for (int servers : {1, 2, 3, 7, 8}) {
      if (space != 0 && space < static_cast<key_type>(servers)) continue;
      range_sharding s(servers, space);
      INFO("key space " << space << ", " << servers << " servers");
      CHECK(s.begin(0) == 0);
      CHECK(s.begin(servers) == (space == 0 ? u128{1} << 64 : u128{space}));
      u128 smallest = ~u128{0}, largest = 0;
      for (int i = 0; i < servers; ++i) {
        const auto lo = s.begin(i), hi = s.begin(i + 1);
        REQUIRE(lo < hi);
        smallest = std::min(smallest, hi - lo);
        largest = std::max(largest, hi - lo);
        // The boundary keys belong where the ranges say.
        CHECK(s.server_of(static_cast<key_type>(lo)) == i);
        CHECK(s.server_of(static_cast<key_type>(hi - 1)) == i);
      }
      CHECK(largest - smallest <= 1);
      const key_type last = space == 0 ? std::numeric_limits<key_type>::max() : space - 1;
      CHECK(s.server_of(last) == servers - 1);
      CHECK(s.contains(last));
      if (space != 0) CHECK_FALSE(s.contains(space));
    }
  }
  // Every key of a small space, one by one: owners ascend and each server gets its range.
  range_sharding small(3, 10);
  std::vector<int> owners;
  for (key_type k = 0; k < 10; ++k) owners.push_back(small.server_of(k));
  CHECK(owners == std::vector<int>{0, 0, 0, 1, 1, 1, 2, 2, 2, 2});
  CHECK_THROWS_AS(range_sharding(0), dtrain::error);
  CHECK_THROWS_AS(range_sharding(5, 4), dtrain::error);
}

TEST_CASE("consistent hashing: balanced with virtual nodes, few keys move when a server joins",
          "[ps][sharding]") {
  std::mt19937_64 gen(5);
  std::vector<key_type> keys(200000);
  for (auto& k : keys) k = gen() >> 40;  // small, clustered keys: hashing must still spread them
  for (int servers : {2, 4, 7}) {
    consistent_hash_sharding s(servers, 256, 9);
    std::vector<std::size_t> load(static_cast<std::size_t>(servers), 0);
    for (auto k : keys) ++load[static_cast<std::size_t>(s.server_of(k))];
    const double mean = static_cast<double>(keys.size()) / servers;
    for (auto l : load) {
      INFO(servers << " servers: load " << l << " against mean " << mean);
      CHECK(std::fabs(static_cast<double>(l) - mean) < 0.15 * mean);
    }
    consistent_hash_sharding grown(servers + 1, 256, 9);
    std::size_t moved = 0;
    for (auto k : keys) {
      const int before = s.server_of(k), after = grown.server_of(k);
      if (before != after) {
        ++moved;
        CHECK(after == servers);  // keys move only to the new server
      }
    }
    const double expected = static_cast<double>(keys.size()) / (servers + 1);
    CHECK(std::fabs(static_cast<double>(moved) - expected) < 0.2 * expected);
    CHECK(consistent_hash_sharding(servers, 256, 9).server_of(keys[0]) == s.server_of(keys[0]));  // deterministic
  }
}

TEST_CASE("partition_keys keeps every key once, by owner, in order", "[ps][sharding]") {
  std::mt19937_64 gen(3);
  std::vector<key_type> keys(5000);
  for (auto& k : keys) k = gen() % (key_type{1} << 24);
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  auto check = [&](const auto& s) {
    const auto p = partition_keys(s, keys);
    REQUIRE(p.offsets.size() == static_cast<std::size_t>(s.servers()) + 1);
    CHECK(p.offsets.back() == keys.size());
    std::vector<int> seen(keys.size(), 0);
    for (int srv = 0; srv < s.servers(); ++srv) {
      const auto mine = p.of(srv);
      for (std::size_t i = 0; i < mine.size(); ++i) {
        ++seen[mine[i]];
        CHECK(s.server_of(keys[mine[i]]) == srv);
        if (i > 0) CHECK(keys[mine[i - 1]] < keys[mine[i]]);
      }
    }
    CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
  };
  check(range_sharding(3, key_type{1} << 24));
  check(consistent_hash_sharding(5));
  std::vector<key_type> unsorted{1, 5, 3};
  CHECK_THROWS_WITH(partition_keys(range_sharding(2), unsorted), Catch::Contains("key 3 at position 2 follows 5"));
  std::vector<key_type> duplicate{1, 5, 5};
  CHECK_THROWS_WITH(partition_keys(range_sharding(2), duplicate), Catch::Contains("sorted and unique"));
  std::vector<key_type> outside{1, 1u << 24};
  CHECK_THROWS_WITH(partition_keys(range_sharding(2, key_type{1} << 24), outside),
                    Catch::Contains("outside the key space"));
}

TEST_CASE("dense layout: slices of at most the slice size, every element once, spread over servers",
          "[ps][sharding]") {
  dense_layout layout(4 << 20, sizeof(float));  // 1M floats per slice
  range_sharding by_slice(2, 64);
  const auto a = layout.add_tensor(3 * (1 << 20) + 5, by_slice);
  const auto b = layout.add_tensor(10, by_slice);
  CHECK(layout.slice_elements() == std::size_t{1} << 20);
  const auto [first, last] = layout.slices_of(a);
  CHECK(last - first == 4);
  std::size_t covered = 0;
  for (std::size_t i = first; i < last; ++i) {
    const auto& s = layout.slices()[i];
    CHECK(s.offset == covered);
    CHECK(s.count <= layout.slice_elements());
    covered += s.count;
  }
  CHECK(covered == layout.tensor_size(a));
  CHECK(layout.slices_of(b).second - layout.slices_of(b).first == 1);
  consistent_hash_sharding hashed(4);
  dense_layout big(1 << 20, sizeof(float));
  big.add_tensor(64 << 18, hashed);  // 64 slices over 4 servers
  std::vector<int> per_server(4, 0);
  for (const auto& s : big.slices()) ++per_server[static_cast<std::size_t>(s.server)];
  for (int n : per_server) CHECK(n > 4);  // every server holds a share
}
