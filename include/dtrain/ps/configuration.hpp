#pragma once
/// @file
/// `ps::job_configuration`: what every server and worker of one job must agree on. A worker's
/// hello carries it as seven words (in place of keys) and each server compares them with its own,
/// so a worker started with other counts, another consistency model, another value type or
/// another replication factor is refused at once, naming both sides.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "dtrain/core/error.hpp"
#include "dtrain/ps/protocol.hpp"
#include "dtrain/ps/roles.hpp"

namespace dtrain::ps {

struct job_configuration {
  roles group;
  std::string_view consistency;  ///< the consistency model's name
  std::size_t value_bytes = 0;
  int replicas = 1;

  /// The words a hello carries: servers, workers, the consistency's name digest, value bytes,
  /// replicas, standby servers, late workers, shards, growing servers.
  std::array<std::uint64_t, 9> words() const noexcept {
    return {static_cast<std::uint64_t>(group.servers),
            static_cast<std::uint64_t>(group.workers),
            name_digest(consistency),
            value_bytes,
            static_cast<std::uint64_t>(replicas),
            static_cast<std::uint64_t>(group.standby),
            static_cast<std::uint64_t>(group.late_workers),
            static_cast<std::uint64_t>(group.shard_count()),
            static_cast<std::uint64_t>(group.growing)};
  }

  /// Checks the words of worker `worker`'s hello against this (server `server`'s) configuration.
  /// @throws dtrain::error `invalid_argument` naming both sides when they differ
  void check_hello(std::span<const std::uint64_t> got, std::uint32_t worker, int server) const {
    const auto want = words();
    if (got.size() == want.size() && std::equal(got.begin(), got.end(), want.begin())) return;
    throw error(errc::invalid_argument, "worker " + std::to_string(worker) +
                                            " was configured differently from server " + std::to_string(server) + " (" +
                                            describe() + ")");
  }

  /// "2 servers, 3 workers, bsp, 4-byte values, 2 replicas" (and ", 1 standby", ", 1 late",
  /// ", 6 shards" with standbys, late workers and more shards than servers)
  std::string describe() const {
    return std::to_string(group.servers) + " servers, " + std::to_string(group.workers) + " workers, " +
           std::string(consistency) + ", " + std::to_string(value_bytes) + "-byte values, " + std::to_string(replicas) +
           (replicas == 1 ? " replica" : " replicas") +
           (group.standby > 0 ? ", " + std::to_string(group.standby) + " standby" : std::string()) +
           (group.late_workers > 0 ? ", " + std::to_string(group.late_workers) + " late" : std::string()) +
           (group.shard_count() != group.servers ? ", " + std::to_string(group.shard_count()) + " shards"
                                                 : std::string()) +
           (group.growing > 0 ? ", " + std::to_string(group.growing) + " growing" : std::string());
  }
};

}  // namespace dtrain::ps
