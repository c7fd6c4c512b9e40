#pragma once
// What the in-process allreduce and sharded trainer tests share: several buckets in flight, and
// weights compared with the serial simulation's.

#include <cstddef>
#include <vector>

#include "../catch.hpp"
#include "dtrain/allreduce/trainer_options.hpp"
#include "dtrain/sharded/options.hpp"

namespace dtrain::testing {

// The allreduce trainer's options, or the sharded trainer's (the same two fields).
template <class Options = allreduce::trainer_options>
Options small_buckets() {
  Options o;
  o.first_bucket_bytes = 8 * 10;  // a few tensors per bucket: several buckets in flight
  o.bucket_bytes = 8 * 64;
  return o;
}

// The sharded trainer's: several buckets, most of them not a multiple of P long (69 and 61 of
// linear_model.hpp's 130 parameters).
inline sharded::trainer_options sharded_buckets() { return small_buckets<sharded::trainer_options>(); }

inline void require_close(const std::vector<double>& got, const std::vector<double>& want, double rel) {
  REQUIRE(got.size() == want.size());
  for (std::size_t j = 0; j < got.size(); ++j) {
    INFO("weight " << j);
    REQUIRE(got[j] == Approx(want[j]).epsilon(rel).margin(rel));
  }
}

}  // namespace dtrain::testing
