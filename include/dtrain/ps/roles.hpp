#pragma once
/// @file
/// Who is who in a parameter-server group: ranks [0, servers) are servers, the rest workers.
/// One transport carries both roles, so a job is one group, launched once (dtrain-run, mpirun,
/// srun, or threads), and a missing member is named by the transport's own start-up deadline.

#include <cstdint>
#include <cstdlib>
#include <string>

#include "dtrain/core/error.hpp"

namespace dtrain::ps {

struct roles {
  int servers = 1;
  int workers = 1;

  /// @throws dtrain::error `invalid_argument` unless 1 <= servers < group size
  static roles of(int group_size, int servers) {
    if (servers < 1 || servers >= group_size) {
      throw error(errc::invalid_argument, "ps::roles: " + std::to_string(servers) + " servers in a group of " +
                                              std::to_string(group_size) + "; need at least one server and one worker");
    }
    return {servers, group_size - servers};
  }

  /// The server count from DTRAIN_PS_SERVERS (default 1).
  static roles from_environment(int group_size) {
    const char* v = std::getenv("DTRAIN_PS_SERVERS");
    int servers = 1;
    if (v != nullptr && *v != '\0') {
      char* end = nullptr;
      const long n = std::strtol(v, &end, 10);
      if (*end != '\0' || n < 1 || n > 1 << 20) {
        throw error(errc::invalid_argument, std::string("DTRAIN_PS_SERVERS=") + v + " is not a server count");
      }
      servers = static_cast<int>(n);
    }
    return of(group_size, servers);
  }

  bool is_server(int rank) const noexcept { return rank < servers; }
  int server_rank(int s) const noexcept { return s; }
  int worker_rank(int w) const noexcept { return servers + w; }
  int worker_of(int rank) const noexcept { return rank - servers; }
};

}  // namespace dtrain::ps
