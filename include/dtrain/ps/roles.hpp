#pragma once
/// @file
/// Who is who in a parameter-server group: ranks [0, servers) are servers, the next `workers`
/// ranks workers, and the last `standby` ranks standby servers, which hold nothing until a
/// server is lost and then join its chains in its place (ps/server.hpp). One transport carries
/// every role, so a job is one group, launched once (dtrain-run, mpirun, srun, or threads), and
/// a missing member is named by the transport's own start-up deadline.
///
/// The last `late_workers` workers join the running job: the servers do not wait for them, and
/// each enters at a clock every shard agrees on (ps/worker.hpp). With the TCP transport they are
/// late ranks too (`tcp_options::late_ranks`), connecting after the group formed.
///
/// The keys are cut into `shards` key ranges (by default one per server). More shards than
/// servers spreads each server's keys over several shards (ps/chain.hpp places them), so that
/// whole shards can move to servers added to the running job: the first `growing` standby
/// servers add capacity. Each takes, when it comes, the shards j with j mod (servers + growing)
/// = servers + its index (`grows_into`), and their first copy gives them up.

#include <cstdint>
#include <cstdlib>
#include <string>

#include "dtrain/core/error.hpp"

namespace dtrain::ps {

struct roles {
  int servers = 1;
  int workers = 1;
  int standby = 0;
  int late_workers = 0;
  int shards = 0;  ///< key ranges; 0: one per server
  int growing = 0;  ///< standby servers that add capacity (the first ones)

  /// @param shards key ranges (0: one per server)  @param growing standby servers that take
  ///   shards when they come (`grows_into`)
  /// @throws dtrain::error `invalid_argument` unless there is at least one server and one
  ///   worker that starts with the job, and at least one shard per server, growing ones too
  static roles of(int group_size, int servers, int standby = 0, int late_workers = 0, int shards = 0, int growing = 0) {
    if (servers < 1 || standby < 0 || late_workers < 0 || servers + standby + late_workers >= group_size) {
      throw error(errc::invalid_argument, "ps::roles: " + std::to_string(servers) + " servers, " +
                                              std::to_string(standby) + " standby servers and " +
                                              std::to_string(late_workers) + " late workers in a group of " +
                                              std::to_string(group_size) +
                                              "; need at least one server and one worker that starts with the job");
    }
    if (shards != 0 && shards < servers) {
      throw error(errc::invalid_argument,
                  "ps::roles: " + std::to_string(shards) + " shards on " + std::to_string(servers) +
                      " servers; each server heads at least one (DTRAIN_PS_SHARDS >= DTRAIN_PS_SERVERS)");
    }
    if (growing < 0 || growing > standby || (growing > 0 && shards < servers + growing)) {
      throw error(errc::invalid_argument, "ps::roles: " + std::to_string(growing) + " growing servers, " +
                                              std::to_string(standby) + " standby servers and " +
                                              std::to_string(shards) + " shards on " + std::to_string(servers) +
                                              " servers; a growing server is a standby, and "
                                              "needs a shard to take (DTRAIN_PS_SHARDS >= servers + growing)");
    }
    return {servers, group_size - servers - standby, standby, late_workers, shards == servers ? 0 : shards, growing};
  }

  /// The counts from DTRAIN_PS_SERVERS (default 1), DTRAIN_PS_STANDBY, DTRAIN_PS_LATE_WORKERS,
  /// DTRAIN_PS_GROWING (default 0) and DTRAIN_PS_SHARDS (default: one per server).
  static roles from_environment(int group_size) {
    return of(group_size, count_from("DTRAIN_PS_SERVERS", 1), count_from("DTRAIN_PS_STANDBY", 0),
              count_from("DTRAIN_PS_LATE_WORKERS", 0), count_from("DTRAIN_PS_SHARDS", 0),
              count_from("DTRAIN_PS_GROWING", 0));
  }

  /// The key ranges the keys are cut into.
  int shard_count() const noexcept { return shards > 0 ? shards : servers; }
  /// The growing standby server that `shard` moves to when it comes (its rank), or -1.
  int grows_into(int shard) const noexcept {
    const int target = shard % (servers + growing);
    return target < servers ? -1 : standby_rank(target - servers);
  }

  bool is_server(int rank) const noexcept { return rank < servers || rank >= servers + workers; }
  bool is_standby(int rank) const noexcept { return rank >= servers + workers; }
  int server_rank(int s) const noexcept { return s; }
  int worker_rank(int w) const noexcept { return servers + w; }
  int worker_of(int rank) const noexcept { return rank - servers; }
  /// Whether worker `w` joins the running job (one of the last `late_workers`).
  bool is_late_worker(int w) const noexcept { return w >= workers - late_workers; }
  /// The rank of standby server `i`.
  int standby_rank(int i) const noexcept { return servers + workers + i; }
  int size() const noexcept { return servers + workers + standby; }

 private:
  static int count_from(const char* name, int fallback) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') return fallback;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (*end != '\0' || n < 0 || n > 1 << 20)
      throw error(errc::invalid_argument, std::string(name) + "=" + v + " is not a count");
    return static_cast<int>(n);
  }
};

}  // namespace dtrain::ps
