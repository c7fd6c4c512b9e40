#pragma once
/// @file
/// Where a process stands in its job, read from the environment its launcher left: dtrain's own
/// variables, torchrun's, Open MPI's, Slurm's or PMI's (MPICH's Hydra), in that order.

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <string_view>

#include "dtrain/core/error.hpp"

namespace dtrain {

/// What the environment says about this process and how its ranks meet.
struct launch_environment {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  std::string launcher = "none";  ///< dtrain, torchrun, openmpi, slurm, pmi or none
  std::string job_id;             ///< the launcher's job identity, when it has one

  /// The rendezvous store: a directory (file store) when `store_dir` is set; otherwise a TCP
  /// store at store_host:store_port, served by rank 0 unless `store_external` (a launcher such
  /// as dtrain-run serves it).
  std::string store_dir;
  std::string store_host;
  std::uint16_t store_port = 0;
  bool store_external = false;
};

/// Looks a variable up; returns nullptr when unset. Tests pass their own.
using env_lookup = std::function<const char*(const char*)>;

namespace detail::env {

inline int to_int(const char* name, const char* v) {
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || x < 0 || x > (1 << 24)) {
    throw error(errc::invalid_argument, std::string("dtrain: ") + name + "=" + v + " is not a valid number");
  }
  return static_cast<int>(x);
}

inline std::uint16_t to_port(const char* name, const char* v) {
  int p = to_int(name, v);
  if (p == 0 || p > 65535) {
    throw error(errc::invalid_argument, std::string("dtrain: ") + name + "=" + v + " is not a TCP port");
  }
  return static_cast<std::uint16_t>(p);
}

/// The first host of a Slurm node list: "gpu[03-06,9],cpu1" -> "gpu03".
inline std::string first_slurm_host(std::string_view list) {
  std::string out;
  for (std::size_t i = 0; i < list.size(); ++i) {
    char c = list[i];
    if (c == ',') break;
    if (c == '[') {
      for (std::size_t j = i + 1; j < list.size() && list[j] != '-' && list[j] != ',' && list[j] != ']'; ++j) {
        out.push_back(list[j]);
      }
      break;
    }
    out.push_back(c);
  }
  return out;
}

/// A port every rank derives alike from the job id, in [20000, 32768): below Linux's ephemeral
/// range (32768-60999 by default), so no outgoing connection on the host can be holding it.
inline std::uint16_t port_for_job(std::string_view job) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (char c : job) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return static_cast<std::uint16_t>(20000 + h % 12768);
}

}  // namespace detail::env

/// Reads the launch environment. @throws dtrain::error for malformed values, or when a
/// multi-process job gives no way to find its rendezvous store (naming the variables to set).
inline launch_environment detect_launch(const env_lookup& get = [](const char* n) { return std::getenv(n); }) {
  using detail::env::to_int;
  auto first = [&](std::initializer_list<const char*> names, const char*& which) -> const char* {
    for (const char* n : names) {
      if (const char* v = get(n); v != nullptr && *v != '\0') {
        which = n;
        return v;
      }
    }
    return nullptr;
  };
  struct scheme {
    const char* launcher;
    const char* rank;
    const char* size;
    bool pair;  // the launcher always sets both: one without the other is a launch script's slip
  };
  // (Slurm's allocation shell sets SLURM_NTASKS with no SLURM_PROCID: a program started there,
  // outside srun, runs alone.)
  static constexpr scheme schemes[] = {
      {"dtrain", "DTRAIN_RANK", "DTRAIN_WORLD_SIZE", true},
      {"torchrun", "RANK", "WORLD_SIZE", true},
      {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", true},
      {"slurm", "SLURM_PROCID", "SLURM_NTASKS", false},
      {"pmi", "PMI_RANK", "PMI_SIZE", true},
  };
  auto set = [](const char* v) { return v != nullptr && *v != '\0'; };
  launch_environment e;
  std::string half;  // the first launcher's pair found half set, refused if no launcher matches
  for (const auto& s : schemes) {
    const char* r = get(s.rank);
    const char* n = get(s.size);
    if (s.pair && set(r) != set(n) && half.empty()) {
      half = std::string("dtrain: ") + (set(r) ? s.rank : s.size) + " is set but " + (set(r) ? s.size : s.rank) +
             " is not: a " + s.launcher + "-style launch sets both (or neither, to run one process alone)";
    }
    if (r == nullptr || n == nullptr) continue;
    e.launcher = s.launcher;
    e.rank = to_int(s.rank, r);
    e.size = to_int(s.size, n);
    if (e.size < 1 || e.rank >= e.size) {
      throw error(errc::invalid_argument, std::string("dtrain: ") + s.rank + "=" + r + " is not below " +
                                              s.size + "=" + n);
    }
    break;
  }
  // Half a pair and no launcher: each process would train alone, and say nothing. (A launcher
  // that did match wins: a Slurm script that exports WORLD_SIZE for torch, say.)
  if (e.launcher == "none" && !half.empty()) throw error(errc::invalid_argument, half);
  const char* which = nullptr;
  if (const char* v = first({"DTRAIN_LOCAL_RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID",
                             "MPI_LOCALRANKID"}, which)) {
    e.local_rank = to_int(which, v);
  } else {
    e.local_rank = e.rank;
  }
  if (const char* v = first({"DTRAIN_LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE",
                             "MPI_LOCALNRANKS"}, which)) {
    e.local_size = to_int(which, v);
  } else {
    e.local_size = e.launcher == "none" ? 1 : (e.launcher == "slurm" ? 0 : e.size);
  }
  if (const char* v = first({"SLURM_JOB_ID"}, which)) {
    const char* step = get("SLURM_STEP_ID");
    e.job_id = std::string(v) + "." + (step != nullptr ? step : "0");
  } else if (const char* j =
                 first({"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "PMI_JOBID", "TORCHELASTIC_RUN_ID"}, which)) {
    e.job_id = j;
  }

  if (const char* dir = get("DTRAIN_STORE_DIR"); dir != nullptr && *dir != '\0') {
    e.store_dir = dir;
    return e;
  }
  if (const char* s = get("DTRAIN_STORE"); s != nullptr && *s != '\0') {
    std::string_view text(s);
    auto colon = text.rfind(':');
    if (colon == std::string_view::npos) {
      throw error(errc::invalid_argument, std::string("dtrain: DTRAIN_STORE=") + s + " is not host:port");
    }
    e.store_host = std::string(text.substr(0, colon));
    e.store_port = detail::env::to_port("DTRAIN_STORE", std::string(text.substr(colon + 1)).c_str());
    e.store_external = true;
    return e;
  }
  if (const char* h = first({"DTRAIN_MASTER_ADDR", "MASTER_ADDR"}, which)) {
    e.store_host = h;
  } else if (const char* nodes = first({"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}, which)) {
    e.store_host = detail::env::first_slurm_host(nodes);
  } else if (e.size == 1 || e.local_size == e.size) {
    e.store_host = "127.0.0.1";  // every rank is on this machine
  } else {
    throw error(errc::invalid_argument,
                "dtrain: a " + e.launcher + " job of " + std::to_string(e.size) +
                    " ranks across machines needs its rendezvous: set DTRAIN_MASTER_ADDR (or MASTER_ADDR) "
                    "to rank 0's host, or DTRAIN_STORE_DIR to a directory every rank shares");
  }
  if (const char* p = first({"DTRAIN_MASTER_PORT", "MASTER_PORT"}, which)) {
    e.store_port = detail::env::to_port(which, p);
  } else if (!e.job_id.empty()) {
    e.store_port = detail::env::port_for_job(e.job_id);
  } else if (e.size == 1) {
    e.store_port = 0;  // rank 0 alone: any free port
  } else {
    throw error(errc::invalid_argument, "dtrain: set DTRAIN_MASTER_PORT (or MASTER_PORT): the " + e.launcher +
                                            " launcher gives no job id to derive a port from");
  }
  return e;
}

}  // namespace dtrain
