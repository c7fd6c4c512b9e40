#pragma once
// Diagnostics: to stderr, or to the handler a program set (core/log.hpp has the levels and
// DTRAIN_LOG). Warnings (refused connections, dropped frames) always show, connection details on
// request.

#include <cstdio>
#include <mutex>
#include <string>

#include "dtrain/core/log.hpp"

namespace dtrain::detail {

using dtrain::log_level;
using dtrain::log_threshold;

inline bool log_enabled(log_level level) noexcept { return level <= log_threshold(); }

inline void log(log_level level, const std::string& message) noexcept {
  if (!log_enabled(level)) return;
  static constexpr const char* names[] = {"error", "warn", "info", "debug"};
  static std::mutex m;  // one line at a time from the I/O and caller threads
  std::lock_guard lock(m);
  if (const log_handler handler = log_handler_slot().load(); handler != nullptr) {
    handler(level, message);
    return;
  }
  std::fprintf(stderr, "dtrain %s: %s\n", names[static_cast<int>(level)], message.c_str());
  std::fflush(stderr);
}

}  // namespace dtrain::detail
