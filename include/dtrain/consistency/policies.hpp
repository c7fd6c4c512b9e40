#pragma once
/// @file
/// The consistency models: bsp, asp, ssp<S> and soft_sync<S> (models of `consistency`).
/// Clocks count completed iterations; see concepts/consistency.hpp for the contract.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string_view>

namespace dtrain {

/// No bound: `staleness_bound()` of ASP and soft sync.
inline constexpr std::int64_t unbounded = std::numeric_limits<std::int64_t>::max();

/// Bulk synchronous parallel: nobody starts clock c+1 before everyone finished c; the server
/// applies a round once every worker pushed it.
struct bsp {
  static constexpr std::string_view name = "bsp";
  std::int64_t staleness_bound() const noexcept { return 0; }
  bool may_advance(std::int64_t clock, std::int64_t slowest) const noexcept { return clock <= slowest; }
  int pushes_to_apply(int workers) const noexcept { return std::max(1, workers); }
  std::int64_t visible_clock(std::int64_t clock) const noexcept { return clock - 1; }
};

/// Asynchronous parallel: workers never wait; each push applies on arrival.
struct asp {
  static constexpr std::string_view name = "asp";
  std::int64_t staleness_bound() const noexcept { return unbounded; }
  bool may_advance(std::int64_t, std::int64_t) const noexcept { return true; }
  int pushes_to_apply(int) const noexcept { return 1; }
  std::int64_t visible_clock(std::int64_t) const noexcept { return -1; }
};

/// Stale synchronous parallel with bound S (Ho et al. 2013): a worker at clock c sees every
/// update from clocks <= c - S - 1 and blocks while it is more than S clocks ahead of the slowest.
template <std::int64_t S>
struct ssp {
  static_assert(S >= 0, "the staleness bound is a number of clocks");
  static constexpr std::string_view name = "ssp";
  std::int64_t staleness_bound() const noexcept { return S; }
  bool may_advance(std::int64_t clock, std::int64_t slowest) const noexcept {
    return clock - slowest <= S;
  }
  int pushes_to_apply(int) const noexcept { return 1; }
  std::int64_t visible_clock(std::int64_t clock) const noexcept { return clock - S - 1; }
};

/// Soft synchronisation (Zhang, Gupta, Lian and Liu 2016): the server averages and applies once
/// S pushes have arrived (S = 1 is ASP, S = n is BSP without the barrier); workers do not wait.
template <int S>
struct soft_sync {
  static_assert(S >= 1, "soft sync applies after at least one push");
  static constexpr std::string_view name = "soft_sync";
  std::int64_t staleness_bound() const noexcept { return unbounded; }
  bool may_advance(std::int64_t, std::int64_t) const noexcept { return true; }
  int pushes_to_apply(int workers) const noexcept { return std::clamp(S, 1, std::max(1, workers)); }
  std::int64_t visible_clock(std::int64_t) const noexcept { return -1; }
};

}  // namespace dtrain
