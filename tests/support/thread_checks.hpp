#pragma once
// Catch2's assertions are not thread-safe; where the ranks of a test are threads, they take
// turns through these.

#include <mutex>

#include "../catch.hpp"

namespace dtrain::testing {
inline std::mutex check_mutex;
}  // namespace dtrain::testing

#define TCHECK(...)                                             \
  do {                                                          \
    std::lock_guard check_lock(::dtrain::testing::check_mutex); \
    CHECK(__VA_ARGS__);                                         \
  } while (0)
#define TCHECK_FALSE(...)                                       \
  do {                                                          \
    std::lock_guard check_lock(::dtrain::testing::check_mutex); \
    CHECK_FALSE(__VA_ARGS__);                                   \
  } while (0)
#define TFAIL(...)                                              \
  do {                                                          \
    std::lock_guard check_lock(::dtrain::testing::check_mutex); \
    FAIL_CHECK(__VA_ARGS__);                                    \
  } while (0)
