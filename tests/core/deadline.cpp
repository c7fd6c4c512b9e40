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

TEST_CASE("deadline::later adds without wrapping and leaves never() alone", "[core][deadline]") {
  const deadline at(deadline::clock::time_point(100s));
  CHECK(at.later(50ms).time() == deadline::clock::time_point(100s + 50ms));
  CHECK(deadline::never().later(50ms) == deadline::never());
  CHECK(deadline::never().later(std::chrono::hours::max()) == deadline::never());
  CHECK(at.later(std::chrono::nanoseconds::max()) == deadline::never());
  CHECK(at.later(std::chrono::duration<double>(std::numeric_limits<double>::infinity())) == deadline::never());
  CHECK(at.later(0s) == at);
  CHECK(at.later(-5s) == at);
  CHECK(at.later(std::chrono::duration<double>(std::numeric_limits<double>::quiet_NaN())) == at);
  // One nanosecond short of the clock's end still adds exactly.
  const deadline near(deadline::clock::time_point::max() - 2ns);
  CHECK(near.later(1ns).time() == deadline::clock::time_point::max() - 1ns);
  CHECK(near.later(3ns) == deadline::never());
  CHECK(near.later(1h) == deadline::never());
  static_assert(deadline(deadline::clock::time_point(1s)).later(5ms).time() == deadline::clock::time_point(1s + 5ms));
}
