#include <string>
#include <system_error>

#include "../catch.hpp"
#include "dtrain/core/deadline.hpp"
#include "dtrain/core/error.hpp"

TEST_CASE("errc values are std::error_codes of the dtrain category", "[core][error]") {
  std::error_code ec = dtrain::errc::timeout;
  CHECK(ec.category().name() == std::string("dtrain"));
  CHECK(ec == dtrain::errc::timeout);
  CHECK(ec != dtrain::errc::peer_lost);
  CHECK(ec.message() == "deadline exceeded");
  for (int e = 1; e <= static_cast<int>(dtrain::errc::bad_data); ++e) {
    CHECK(dtrain::error_category().message(e) != "unknown dtrain error");
  }
}

TEST_CASE("dtrain::error is a system_error carrying code and context", "[core][error]") {
  try {
    dtrain::throw_if(dtrain::errc::peer_lost, "receive from rank 3");
    FAIL("throw_if did not throw");
  } catch (const std::system_error& e) {
    CHECK(e.code() == dtrain::errc::peer_lost);
    CHECK(std::string(e.what()).find("receive from rank 3") != std::string::npos);
  }
  CHECK_NOTHROW(dtrain::throw_if(std::error_code{}, "nothing"));
}

TEST_CASE("deadlines", "[core][deadline]") {
  using namespace std::chrono_literals;
  auto soon = dtrain::deadline::after(50ms);
  CHECK_FALSE(soon.expired());
  CHECK(soon.remaining() > 0ms);
  CHECK(soon.remaining() <= 50ms);
  CHECK(dtrain::deadline::after(-1ms).expired());
  CHECK(dtrain::deadline::after(-1ms).remaining() == 0ms);
  CHECK_FALSE(dtrain::deadline::never().expired());
  CHECK(soon < dtrain::deadline::never());
}
