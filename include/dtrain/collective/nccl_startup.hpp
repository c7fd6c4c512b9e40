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

#include "dtrain/core/deadline.hpp"
#include "dtrain/core/error.hpp"

namespace dtrain::detail::nccl {

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
