#include <cstdint>
#include <random>
#include <vector>

#include "../catch.hpp"
#include "dtrain/reduce/host.hpp"
#include "reduce_reference.hpp"

TEST_CASE("host_reduction: every op and type matches a scalar reference", "[reduce][host]") {
#if defined(__F16C__)
  if (!__builtin_cpu_supports("f16c")) {
    WARN("skipped: this build uses F16C instructions and this CPU has none");
    return;
  }
#endif
  dtrain::test::check_reduction(dtrain::host_reduction{});
}

TEST_CASE("pack_scaled and unpack round like the scalar conversions, for every length", "[reduce][host]") {
  std::mt19937 gen(11);
  std::normal_distribution<float> n(0.0f, 50.0f);
  for (std::size_t len : {0u, 1u, 7u, 8u, 9u, 1000u}) {
    std::vector<float> x(len), back(len);
    for (float& v : x) v = n(gen);
    std::vector<dtrain::float16> h(len);
    std::vector<dtrain::bfloat16> b(len);
    dtrain::detail::pack_scaled(x.data(), h.data(), len, 0.25f);
    dtrain::detail::pack_scaled(x.data(), b.data(), len, 0.25f);
    for (std::size_t i = 0; i < len; ++i) {
      CHECK(h[i].bits == dtrain::float16(x[i] * 0.25f).bits);
      CHECK(b[i].bits == dtrain::bfloat16(x[i] * 0.25f).bits);
    }
    dtrain::detail::unpack(h.data(), back.data(), len);
    for (std::size_t i = 0; i < len; ++i) CHECK(back[i] == static_cast<float>(h[i]));
    dtrain::detail::unpack(b.data(), back.data(), len);
    for (std::size_t i = 0; i < len; ++i) CHECK(back[i] == static_cast<float>(b[i]));
  }
}
