// Deadlines from durations at the edges of the clock's range: "wait forever" spelled as a
// duration's max must not wrap into the past, and what is already over must read as expired.

#include <chrono>
#include <limits>

#include "../catch.hpp"
#include "dtrain/core/deadline.hpp"

using namespace std::chrono_literals;
using dtrain::deadline;

TEST_CASE("deadline::after saturates at the clock's end and expires at once for nothing left", "[core][deadline]") {
  SECTION("durations past the clock's range never expire") {
    CHECK(deadline::after(std::chrono::milliseconds::max()) == deadline::never());
    CHECK(deadline::after(std::chrono::nanoseconds::max()) == deadline::never());
    CHECK(deadline::after(std::chrono::hours::max()) == deadline::never());
    CHECK(deadline::after(std::chrono::duration<double>(1e300)) == deadline::never());
    CHECK(deadline::after(std::chrono::duration<double>(std::numeric_limits<double>::infinity())) ==
          deadline::never());
    CHECK_FALSE(deadline::after(std::chrono::milliseconds::max()).expired());
  }
  SECTION("an ordinary timeout lands where now + timeout does") {
    const auto before = deadline::clock::now();
    const deadline d = deadline::after(10min);
    const auto after = deadline::clock::now();
    CHECK(d.time() >= before + 10min);
    CHECK(d.time() <= after + 10min);
    CHECK_FALSE(d.expired());
    CHECK(d.remaining() > 9min);
  }
  SECTION("zero, negative and NaN timeouts have expired already") {
    CHECK(deadline::after(0ms).expired());
    CHECK(deadline::after(-5s).expired());
    CHECK(deadline::after(std::chrono::milliseconds::min()).expired());
    CHECK(deadline::after(std::chrono::duration<double>(std::numeric_limits<double>::quiet_NaN())).expired());
    CHECK(deadline::after(-1ms).remaining() == deadline::clock::duration::zero());
  }
}
