#pragma once
/// @file
/// How `nccl_communicator`'s ranks share rank 0's NCCL unique id when they form a group: through
/// a rendezvous store, or through a host collective that already connects them. Included by
/// collective/nccl.hpp (use that).

#include <nccl.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "dtrain/core/deadline.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/cuda/runtime.hpp"
#include "dtrain/flight/dump.hpp"
#include "dtrain/flight/recorded.hpp"
#include "dtrain/flight/recorder.hpp"

namespace dtrain::detail::nccl {

/// @throws dtrain::error `invalid_argument` unless `rank` is one of a group of `size`
inline void check_rank(int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw error(errc::invalid_argument,
                "nccl: rank " + std::to_string(rank) + " of a group of " + std::to_string(size));
  }
}

/// The GPU of `rank`: `wanted`, or with -1 the local rank's (cuda::local_device; without
/// DTRAIN_LOCAL_RANK, `rank`'s). @throws dtrain::error when no device is visible
inline int device_for(int rank, int wanted) {
  const int local = cuda::local_device(rank);  // checks that a device is visible
  return wanted >= 0 ? wanted : local;
}

/// What to add to a failure to join: one GPU shared by two ranks, where NCCL says only "invalid
/// usage", is the common cause.
inline std::string joining_hint(ncclResult_t state, int device) {
  if (state != ncclInvalidUsage) return "";
  return " (NCCL refuses two ranks of one group on the same GPU, this rank's is device " + std::to_string(device) +
         ": give each rank its own GPU, or share one through staged_communicator)";
}

/// What the flight recorder knows of a communicator's group: its name and place, and the world
/// rank of each member (empty: the same numbers).
struct flight_names {
  flight::recorder::group_info group;
  std::vector<int> members;
};
/// Counts the communicators of `g` built before; its tag keeps its calls apart from a host
/// communicator's in a group of the same name.
inline flight::recorder::group_info flight_counted(flight::recorder::group_info g) {
  g.tag ^= 0x6e63636c;  // "nccl"
  g.generation = flight::recorder::generation_of(g);
  return g;
}
/// A group formed through a store: named by its key, with the launcher's world rank if known.
inline flight_names flight_named(const std::string& name, int rank, int size) {
  const int world = flight::dumper::global().rank();
  return {flight_counted({flight::recorder::intern(name), rank, size, world >= 0 ? world : rank, 0}), {}};
}
/// A group formed over a host collective: "nccl over " its name ("world", a process group's).
template <class HostCollective>
flight_names flight_over(HostCollective& host) {
  flight_names n{{flight::recorder::intern("world"), host.rank(), host.size(), host.rank(), 0}, {}};
  if constexpr (requires { host.transport(); }) {
    n.group = flight::group_of(host.transport(), 0);
    n.members = flight::members_of(host.transport());
  }
  n.group.name = flight::recorder::intern(std::string("nccl over ") + n.group.name);
  n.group = flight_counted(n.group);
  return n;
}

/// Rank 0 publishes `id` under `key`; the others read it (waiting under `d`).
template <class Store>
void share_id_through_store(Store& store, const std::string& key, int rank, ncclUniqueId& id, deadline d) {
  if (rank == 0) {
    store.set(key, std::span<const std::byte>(reinterpret_cast<const std::byte*>(&id), sizeof id), d);
    return;
  }
  const auto bytes = store.get(key, d);
  if (bytes.size() != sizeof id) {
    throw error(errc::protocol_error, "nccl: the unique id under '" + key + "' has " + std::to_string(bytes.size()) +
                                          " bytes, not " + std::to_string(sizeof id));
  }
  std::memcpy(&id, bytes.data(), sizeof id);
}

/// Rank 0's `id` broadcast through `host` (a host collective), as Horovod does through MPI.
template <class HostCollective>
void share_id_through(HostCollective& host, ncclUniqueId& id) {
  static_assert(sizeof(ncclUniqueId) % sizeof(std::int64_t) == 0);
  std::array<std::int64_t, sizeof(ncclUniqueId) / sizeof(std::int64_t)> words{};
  if (host.rank() == 0) std::memcpy(words.data(), &id, sizeof id);
  host.broadcast(std::span<std::int64_t>(words), 0);
  std::memcpy(&id, words.data(), sizeof id);
}

}  // namespace dtrain::detail::nccl
