#pragma once
/// @file
/// Which ranks share a host. `discover_hosts(group)` exchanges every member's host identity
/// once (at start-up) and gives each rank its local rank, local size, its host's group and the
/// group of ranks with its local rank on the other hosts: the two levels of a hierarchical
/// collective, and what a tensor-parallel group should stay inside.
///
/// A host's identity is `DTRAIN_HOST_ID` when set (a launcher's node name, or an emulated host:
/// one network namespace of the emulated cluster), else the machine's host name.

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "dtrain/core/hash.hpp"
#include "dtrain/transport/group.hpp"
#include "dtrain/transport/progress.hpp"
#include "dtrain/transport/rank_list.hpp"

namespace dtrain {

/// Whether every host has two cores for each of its ranks, from every rank's {host id, cores}
/// pair in rank order (what `discover_hosts` exchanges): a host counts the fewest cores any of
/// its ranks reported, and a count of 0 (unknown) is never enough. Every rank that has the same
/// pairs gets the same answer, so it may pick algorithms (`cost_model::reduction_overlaps`).
inline bool two_cores_per_rank(std::span<const std::int64_t> host_and_cores) {
  std::vector<std::pair<std::int64_t, std::int64_t>> seen;  // host id, fewest cores
  std::vector<std::int64_t> ranks;                           // per host in `seen`
  for (std::size_t i = 0; i + 1 < host_and_cores.size(); i += 2) {
    const std::int64_t host = host_and_cores[i], cores = host_and_cores[i + 1];
    auto it = std::find_if(seen.begin(), seen.end(), [&](const auto& h) { return h.first == host; });
    if (it == seen.end()) {
      seen.emplace_back(host, cores);
      ranks.push_back(1);
    } else {
      it->second = std::min(it->second, cores);
      ++ranks[static_cast<std::size_t>(it - seen.begin())];
    }
  }
  for (std::size_t h = 0; h < seen.size(); ++h) {
    const auto cores = static_cast<unsigned>(std::max<std::int64_t>(seen[h].second, 0));
    if (!detail::spare_cores_for(static_cast<int>(ranks[h]), cores)) return false;
  }
  return !seen.empty();
}

/// This host's identity as `discover_hosts` exchanges it: `this_host_id()` hashed to 64 bits.
inline std::int64_t host_id_hash(std::string_view host_id) {
  return static_cast<std::int64_t>(fnv1a().text(host_id).value());
}

/// This process's host identity: `DTRAIN_HOST_ID`, else the host name.
inline std::string this_host_id() {
  if (const char* id = std::getenv("DTRAIN_HOST_ID"); id != nullptr && *id != '\0') return id;
  std::array<char, 256> name{};
  if (::gethostname(name.data(), name.size() - 1) != 0) return "unknown-host";
  return name.data();
}

/// Where a group's ranks run. Hosts are numbered in the order of their lowest rank; ranks on one
/// host are numbered (local ranks) in group order.
template <transport World>
struct host_map {
  std::vector<int> host_of;    ///< per group rank: its host
  std::vector<int> local_of;   ///< per group rank: its local rank
  int hosts = 0;
  int host = 0;                ///< this rank's host
  int local_rank = 0;
  int local_size = 0;
  bool uniform = true;         ///< every host holds the same number of ranks
  /// Every host has two cores per rank on it (the same on every rank: `two_cores_per_rank`).
  bool two_cores_per_rank = false;
  /// The ranks on this host, by local rank.
  process_group<World> local;
  /// The ranks with this local rank, one per host that has it, by host.
  process_group<World> cross;
};

/// Collective over `group`: every member tells its host identity (hashed to 64 bits) and its
/// core count, and each learns the layout and forms its two groups (locally, by name: no further
/// messages).
/// @throws dtrain::error `timeout` naming a member that did not take part; the transport's errors.
template <transport World>
host_map<World> discover_hosts(process_group<World>& group, std::string_view host_id = this_host_id(),
                               unsigned cores = std::thread::hardware_concurrency()) {
  const std::vector<std::int64_t> all =
      group.exchange_setup_values({host_id_hash(host_id), static_cast<std::int64_t>(cores)}, "discover_hosts");
  const int p = group.size();
  std::vector<std::int64_t> seen;  // host ids, in order of their lowest rank
  std::vector<int> host_of(static_cast<std::size_t>(p)), local_of(static_cast<std::size_t>(p));
  std::vector<std::vector<int>> on_host;  // world ranks per host
  for (int r = 0; r < p; ++r) {
    const std::int64_t h = all[2 * static_cast<std::size_t>(r)];
    auto it = std::find(seen.begin(), seen.end(), h);
    const auto index = static_cast<std::size_t>(it - seen.begin());
    if (it == seen.end()) {
      seen.push_back(h);
      on_host.emplace_back();
    }
    host_of[static_cast<std::size_t>(r)] = static_cast<int>(index);
    local_of[static_cast<std::size_t>(r)] = static_cast<int>(on_host[index].size());
    on_host[index].push_back(group.world_rank(r));
  }
  const auto me = static_cast<std::size_t>(group.rank());
  const int host = host_of[me], local_rank = local_of[me];
  std::vector<int> cross;
  for (const auto& ranks : on_host) {
    if (static_cast<std::size_t>(local_rank) < ranks.size())
      cross.push_back(ranks[static_cast<std::size_t>(local_rank)]);
  }
  const std::string base = group.name() + "/hosts:";
  auto local = group.form(rank_list(on_host[static_cast<std::size_t>(host)]), base + "host" + std::to_string(host));
  auto across = group.form(rank_list(std::move(cross)), base + "local" + std::to_string(local_rank));
  const bool uniform = std::all_of(on_host.begin(), on_host.end(),
                                   [&](const auto& ranks) { return ranks.size() == on_host.front().size(); });
  return host_map<World>{std::move(host_of), std::move(local_of), static_cast<int>(seen.size()), host, local_rank,
                         local->size(), uniform, two_cores_per_rank(all), std::move(*local), std::move(*across)};
}

}  // namespace dtrain
