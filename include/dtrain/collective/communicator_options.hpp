#pragma once
/// @file
/// `communicator_options`: how a host communicator (collective/communicator.hpp) runs its
/// collectives: the deadline of each call, its transport tag, the pipeline segment and the
/// algorithm rules. The staged and hierarchical communicators take the same options.

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>

#include "dtrain/collective/selection.hpp"
#include "dtrain/core/error.hpp"

namespace dtrain {

/// How a communicator runs its collectives.
struct communicator_options {
  /// Deadline of each call, from its start. A call that cannot finish in time raises
  /// `errc::timeout` naming the operation, its sequence number and the peer it waited for.
  /// The environment variable DTRAIN_COLLECTIVE_TIMEOUT_MS, where set, replaces it when the
  /// communicator is built (a job's launcher can lengthen the deadlines without a rebuild, as
  /// DTRAIN_ALGORITHMS pins algorithms); `set_timeout` still changes it afterwards.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  /// The transport tag all of this communicator's messages use. Two communicators over one
  /// transport need different tags.
  std::uint64_t tag = 0x647472'61696e00;  // "dtrain\0"
  /// Pipeline granularity of the ring and tree algorithms.
  std::size_t segment_bytes = std::size_t{1} << 20;
  /// Algorithm rules and cost model. The environment variable DTRAIN_ALGORITHMS (same syntax as
  /// `selection_table::parse`) adds rules that take precedence over these.
  selection_table algorithms{};
};

namespace detail {

/// DTRAIN_COLLECTIVE_TIMEOUT_MS's value (`text`): whole milliseconds, digits only, from 1 to
/// 2^31 - 1 (24.8 days; a deadline further out would overflow the clock's nanoseconds).
/// @throws dtrain::error (invalid_argument) naming the variable and the value.
inline std::chrono::milliseconds collective_timeout_from(const char* text) {
  constexpr long long most = 2147483647;
  char* end = nullptr;
  errno = 0;
  const long long ms = text[0] >= '0' && text[0] <= '9' ? std::strtoll(text, &end, 10) : 0;
  if (end == nullptr || *end != '\0' || ms < 1 || ms > most || errno == ERANGE) {
    throw error(errc::invalid_argument, std::string("dtrain: DTRAIN_COLLECTIVE_TIMEOUT_MS=") + text +
                                            " is not a whole number of milliseconds from 1 to 2147483647");
  }
  return std::chrono::milliseconds(ms);
}

/// What the environment changes in `o`: DTRAIN_COLLECTIVE_TIMEOUT_MS its deadline, DTRAIN_ALGORITHMS
/// rules that go before its own. @throws dtrain::error where either is set and cannot be read.
inline void apply_environment(communicator_options& o) {
  if (const char* env = std::getenv("DTRAIN_COLLECTIVE_TIMEOUT_MS"); env != nullptr && *env != '\0') {
    o.timeout = collective_timeout_from(env);
  }
  if (const char* env = std::getenv("DTRAIN_ALGORITHMS"); env != nullptr && *env != '\0') {
    selection_table from_env;
    from_env.parse(env);
    for (const auto& r : o.algorithms.rules()) from_env.add(r);
    from_env.model() = o.algorithms.model();
    o.algorithms = std::move(from_env);
  }
}

}  // namespace detail

}  // namespace dtrain
