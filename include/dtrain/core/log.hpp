#pragma once
// Where dtrain's diagnostics go: stderr ("dtrain warn: ..."), or a handler a program sets to
// route them into its own logging. The level comes from DTRAIN_LOG (error, warn, info, debug;
// default warn), like NCCL_DEBUG.

#include <atomic>
#include <cstdlib>
#include <string_view>

namespace dtrain {

enum class log_level { error = 0, warn = 1, info = 2, debug = 3 };

/// Receives each line dtrain logs: its level and its text, without the "dtrain warn: " prefix.
/// Called from dtrain's I/O and caller threads, one line at a time; it must not throw or call into
/// dtrain.
using log_handler = void (*)(log_level level, std::string_view message);

namespace detail {
inline std::atomic<log_handler>& log_handler_slot() noexcept {
  static std::atomic<log_handler> handler{nullptr};
  return handler;
}
}  // namespace detail

/// Sends every line logged from now on to `handler` instead of stderr (nullptr: stderr again).
/// DTRAIN_LOG still decides which levels are logged.
inline void set_log_handler(log_handler handler) noexcept { detail::log_handler_slot().store(handler); }

/// The most detailed level logged, from DTRAIN_LOG (read once).
inline log_level log_threshold() noexcept {
  static const log_level level = [] {
    const char* v = std::getenv("DTRAIN_LOG");
    const std::string_view s = v != nullptr ? v : "";
    if (s == "error") return log_level::error;
    if (s == "info") return log_level::info;
    if (s == "debug") return log_level::debug;
    return log_level::warn;
  }();
  return level;
}

}  // namespace dtrain
