#pragma once
/// @file
/// The `sharding` concept: which parameter-server shard owns each key, and the key type.

#include <concepts>
#include <cstdint>

namespace dtrain::ps {

/// Parameter-server keys.
using key_type = std::uint64_t;

/// A sharding policy maps every key of its key space to one of `servers()` shards.
///  1. `s.servers()`: the number of shards, >= 1.
///  2. `s.server_of(key)`: the shard that owns `key`, in [0, servers()); the same answer on
///     every process for equal construction arguments.
///  3. `s.contains(key)`: whether `key` is in the key space.
template <class S>
concept sharding = requires(const S& s, key_type k) {
  { s.servers() } noexcept -> std::same_as<int>;
  { s.server_of(k) } noexcept -> std::same_as<int>;
  { s.contains(k) } noexcept -> std::same_as<bool>;
};

}  // namespace dtrain::ps
