#pragma once
/// @file
/// Who is who in a parameter-server group: ranks [0, servers) are servers, the next `workers`
/// ranks workers, and the last `standby` ranks standby servers, which hold nothing until a
/// server is lost and then join its chains in its place (ps/server.hpp). One transport carries
/// every role, so a job is one group, launched once (dtrain-run, mpirun, srun, or threads), and
/// a missing member is named by the transport's own start-up deadline.

#include <cstdint>
#include <cstdlib>
#include <string>

#include "dtrain/core/error.hpp"

namespace dtrain::ps {

struct roles {
  int servers = 1;
  int workers = 1;
  int standby = 0;

  /// @throws dtrain::error `invalid_argument` unless there is at least one server and one worker
  static roles of(int group_size, int servers, int standby = 0) {
    if (servers < 1 || standby < 0 || servers + standby >= group_size) {
      throw error(errc::invalid_argument, "ps::roles: " + std::to_string(servers) + " servers and " + std::to_string(standby) +
                                              " standby servers in a group of " + std::to_string(group_size) +
                                              "; need at least one server and one worker");
    }
    return {servers, group_size - servers - standby, standby};
  }

  /// The counts from DTRAIN_PS_SERVERS (default 1) and DTRAIN_PS_STANDBY (default 0).
  static roles from_environment(int group_size) {
    return of(group_size, count_from("DTRAIN_PS_SERVERS", 1), count_from("DTRAIN_PS_STANDBY", 0));
  }

  bool is_server(int rank) const noexcept { return rank < servers || rank >= servers + workers; }
  bool is_standby(int rank) const noexcept { return rank >= servers + workers; }
  int server_rank(int s) const noexcept { return s; }
  int worker_rank(int w) const noexcept { return servers + w; }
  int worker_of(int rank) const noexcept { return rank - servers; }
  /// The rank of standby server `i`.
  int standby_rank(int i) const noexcept { return servers + workers + i; }
  int size() const noexcept { return servers + workers + standby; }

 private:
  static int count_from(const char* name, int fallback) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') return fallback;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (*end != '\0' || n < 0 || n > 1 << 20) throw error(errc::invalid_argument, std::string(name) + "=" + v + " is not a server count");
    return static_cast<int>(n);
  }
};

}  // namespace dtrain::ps
