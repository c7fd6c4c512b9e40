#pragma once
// Diagnostics on stderr. The level comes from DTRAIN_LOG (error, warn, info, debug; default warn),
// like NCCL_DEBUG: warnings (refused connections, dropped frames) always show, connection details
// on request.

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>

namespace dtrain::detail {

enum class log_level { error = 0, warn = 1, info = 2, debug = 3 };

inline log_level log_threshold() noexcept {
  static const log_level level = [] {
    const char* v = std::getenv("DTRAIN_LOG");
    std::string_view s = v != nullptr ? v : "";
    if (s == "error") return log_level::error;
    if (s == "info") return log_level::info;
    if (s == "debug") return log_level::debug;
    return log_level::warn;
  }();
  return level;
}

inline bool log_enabled(log_level level) noexcept { return level <= log_threshold(); }

inline void log(log_level level, const std::string& message) noexcept {
  if (!log_enabled(level)) return;
  static constexpr const char* names[] = {"error", "warn", "info", "debug"};
  static std::mutex m;  // one line at a time from the I/O and caller threads
  std::lock_guard lock(m);
  std::fprintf(stderr, "dtrain %s: %s\n", names[static_cast<int>(level)], message.c_str());
  std::fflush(stderr);
}

}  // namespace dtrain::detail
