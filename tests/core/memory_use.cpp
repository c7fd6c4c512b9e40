// memory_use: the total adds every kind but `device` (a part of the total, not more of it), and a
// peak kept per kind takes each field's largest, one rising while another falls.

#include "../catch.hpp"
#include "dtrain/core/memory_use.hpp"

using dtrain::memory_use;

TEST_CASE("memory_use: total adds the kinds, device is a part of it, raise_to keeps each kind's most", "[core]") {
  const memory_use a{1, 2, 4, 8, 16, 32, 40};
  CHECK(a.total() == 63);
  memory_use peak = a;
  peak.raise_to(memory_use{2, 1, 5, 7, 17, 31, 41});
  CHECK(peak.parameters == 2);
  CHECK(peak.gradients == 2);
  CHECK(peak.optimizer_state == 5);
  CHECK(peak.buffers == 8);
  CHECK(peak.gathered == 17);
  CHECK(peak.unit_gradients == 32);
  CHECK(peak.device == 41);
  peak.raise_to(memory_use{});
  CHECK(peak.total() == 2 + 2 + 5 + 8 + 17 + 32);
}
