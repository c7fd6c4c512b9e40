#pragma once
// Catch2's assertions are not thread-safe; where the ranks of a test are threads, they take
// turns through these. What they check must not wait on another rank (that rank may be waiting
// for the lock): a call that communicates runs first, through `caught`, and its outcome is
// checked after.

#include <mutex>
#include <string>
#include <system_error>

#include "../catch.hpp"
#include "dtrain/core/error.hpp"

namespace dtrain::testing {
inline std::mutex check_mutex;

// What a call threw as a dtrain::error: its code and text, both empty when it returned.
struct thrown {
  std::error_code code;
  std::string what;
};
template <class Call>
thrown caught(Call&& call) {
  try {
    call();
  } catch (const dtrain::error& e) {
    return {e.code(), e.what()};
  }
  return {};
}
}  // namespace dtrain::testing

#define DTRAIN_TESTING_LOCKED(...)                              \
  do {                                                          \
    std::lock_guard check_lock(::dtrain::testing::check_mutex); \
    __VA_ARGS__;                                                \
  } while (0)
#define TCHECK(...) DTRAIN_TESTING_LOCKED(CHECK(__VA_ARGS__))
#define TCHECK_FALSE(...) DTRAIN_TESTING_LOCKED(CHECK_FALSE(__VA_ARGS__))
#define TREQUIRE(...) DTRAIN_TESTING_LOCKED(REQUIRE(__VA_ARGS__))
#define TFAIL(...) DTRAIN_TESTING_LOCKED(FAIL_CHECK(__VA_ARGS__))
