// IDX parsing (valid files and each way a file can be broken) and the distributed sampler.

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "../catch.hpp"
#include "dtrain/data/idx.hpp"
#include "dtrain/data/sampler.hpp"

using namespace dtrain;

namespace {
std::vector<std::uint8_t> idx_bytes(std::vector<std::uint32_t> shape, std::size_t values) {
  std::vector<std::uint8_t> b{0, 0, 0x08, static_cast<std::uint8_t>(shape.size())};
  for (auto d : shape) {
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<std::uint8_t>(d >> s));
  }
  for (std::size_t i = 0; i < values; ++i) b.push_back(static_cast<std::uint8_t>(i * 7));
  return b;
}

std::string parse_error(const std::vector<std::uint8_t>& bytes, std::size_t dims) {
  try {
    data::parse_idx(bytes, dims, "f.idx");
  } catch (const dtrain::error& e) {
    CHECK(e.code() == errc::bad_data);
    return e.what();
  }
  return "no error";
}
}  // namespace

TEST_CASE("IDX: a valid file parses to its shape and values", "[data]") {
  auto a = data::parse_idx(idx_bytes({3, 2, 4}, 24), 3, "images");
  CHECK(a.shape == std::vector<std::uint32_t>{3, 2, 4});
  CHECK(a.items() == 3);
  CHECK(a.item_size() == 8);
  REQUIRE(a.values.size() == 24);
  CHECK(a.values[5] == 35);
  auto l = data::parse_idx(idx_bytes({300}, 300), 1, "labels");
  CHECK(l.items() == 300);
  CHECK(l.item_size() == 1);
}

TEST_CASE("IDX: each kind of broken file is refused, saying what is wrong", "[data]") {
  CHECK(parse_error({0, 0}, 1).find("fewer than the 4-byte magic") != std::string::npos);
  auto gz = idx_bytes({4}, 4);
  gz[0] = 0x1f;  // a gzip file passed without decompressing
  CHECK(parse_error(gz, 1).find("two zero bytes") != std::string::npos);
  auto floats = idx_bytes({4}, 4);
  floats[2] = 0x0d;
  CHECK(parse_error(floats, 1).find("type code 13") != std::string::npos);
  CHECK(parse_error(idx_bytes({4, 2}, 8), 1).find("2 dimensions, 1 expected") != std::string::npos);
  CHECK(parse_error(idx_bytes({4}, 0), 3).find("1 dimensions, 3 expected") != std::string::npos);
  auto header_cut = idx_bytes({4, 2, 2}, 16);
  header_cut.resize(9);
  CHECK(parse_error(header_cut, 3).find("header is truncated") != std::string::npos);
  CHECK(parse_error(idx_bytes({4, 2, 2}, 15), 3).find("describes 16 values but 15") != std::string::npos);
  CHECK(parse_error(idx_bytes({4, 2, 2}, 17), 3).find("describes 16 values but 17") != std::string::npos);
  CHECK(parse_error(idx_bytes({4, 0, 2}, 0), 3).find("dimension 1 is zero") != std::string::npos);
  CHECK(parse_error(idx_bytes({0xffffffff, 0xffffffff, 2}, 0), 3).find("more than 2^40") != std::string::npos);
  CHECK(parse_error(idx_bytes({4}, 4), 1) == "no error");
}

TEST_CASE("IDX: images and labels must agree", "[data]") {
  auto images = data::parse_idx(idx_bytes({3, 1, 1}, 3), 3, "i");
  auto labels = data::parse_idx(idx_bytes({2}, 2), 1, "l");
  CHECK_THROWS_WITH(data::pair_images_labels(images, labels, 10, "train"), Catch::Contains("3 images but 2 labels"));
  auto bad = data::parse_idx(idx_bytes({3}, 3), 1, "l");  // values 0, 7, 14
  CHECK_THROWS_WITH(data::pair_images_labels(images, bad, 10, "train"),
                    Catch::Contains("label 14 of sample 2 is not below 10"));
  CHECK(data::pair_images_labels(images, bad, 15, "train").labels.items() == 3);
}

TEST_CASE("distributed sampler: equal disjoint shards, same on every rank, new each epoch", "[data]") {
  for (int p : {1, 2, 3, 4, 7}) {
    const std::size_t n = 1003;
    std::set<std::size_t> seen;
    std::vector<std::size_t> epoch0_rank0;
    for (int r = 0; r < p; ++r) {
      data::distributed_sampler s(n, r, p, 42);
      const auto idx = s.indices(0);
      CHECK(idx.size() == n / static_cast<std::size_t>(p));
      for (auto i : idx) {
        CHECK(i < n);
        CHECK(seen.insert(i).second);  // no sample on two ranks
      }
      if (r == 0) epoch0_rank0 = idx;
      CHECK(s.indices(1) != idx);                                       // reshuffled per epoch
      CHECK(data::distributed_sampler(n, r, p, 42).indices(0) == idx);  // reproducible
    }
    CHECK(seen.size() == n - n % static_cast<std::size_t>(p));
    CHECK(data::distributed_sampler(n, 0, p, 43).indices(0) != epoch0_rank0);
  }
  data::distributed_sampler ordered(10, 1, 2, 0, false);
  CHECK(ordered.indices(5) == std::vector<std::size_t>{5, 6, 7, 8, 9});
  CHECK_THROWS_AS(data::distributed_sampler(1, 0, 2), dtrain::error);
  CHECK_THROWS_AS(data::distributed_sampler(10, 2, 2), dtrain::error);
}
