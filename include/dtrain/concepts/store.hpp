#pragma once
/// @file
/// The `store` concept: the key-value store ranks meet through before they can talk directly.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "dtrain/core/deadline.hpp"

namespace dtrain {

/// A store is a key-value map shared by every rank of a job.
///  1. `s.set(key, value, deadline, ec)` stores bytes under `key`, replacing any value.
///  2. `s.get(key, deadline, ec)` returns the value, waiting until some rank sets it or the
///     deadline passes (`errc::timeout`).
///  3. `s.add(key, delta, deadline, ec)` adds `delta` to the integer under `key` (0 if unset) and
///     returns the new value, atomically across ranks.
///  4. Each has a throwing form without `ec` that raises `dtrain::error` naming the key.
///  Semantics: every call is bounded by its deadline; calls may come from several threads; keys
///  are opaque text up to 4096 bytes, values up to 64 MiB. Groups rebuilt without restarting
///  prefix their keys with an epoch (see `epoch_key`).
///  Models: `tcp_store`, `file_store`.
template <class S>
concept store = requires(S& s, const std::string& key, std::span<const std::byte> value, deadline d,
                         std::int64_t delta, std::error_code& ec) {
  { s.set(key, value, d, ec) } noexcept -> std::same_as<bool>;
  { s.get(key, d, ec) } noexcept -> std::same_as<std::vector<std::byte>>;
  { s.add(key, delta, d, ec) } noexcept -> std::same_as<std::int64_t>;
  { s.set(key, value, d) } -> std::same_as<void>;
  { s.get(key, d) } -> std::same_as<std::vector<std::byte>>;
  { s.add(key, delta, d) } -> std::same_as<std::int64_t>;
};

}  // namespace dtrain
