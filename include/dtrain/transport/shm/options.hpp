#pragma once
// `shm_options`: how a shared-memory group is formed and behaves; the engine keeps them as given
// (shm/link.hpp's `settings`), so each default is written once, here.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/rendezvous/environment.hpp"

namespace dtrain {

/// How a shared-memory group is formed and behaves.
struct shm_options {
  /// Deadline for forming the group (rendezvous, mapping every inbox).
  std::chrono::milliseconds timeout{60000};
  /// How long leaving waits for the rings to take what this rank still sends.
  std::chrono::milliseconds linger{10000};
  /// Bytes of each ring (one per ordered pair of ranks): a power of two, at least 4 KiB. Every
  /// rank maps size x ring_bytes of its own and as much of each peer's. Small rings stay in the
  /// caches: 256 KiB carried a 1 MiB allreduce on 2 ranks 1.3x faster than 1 MiB rings
  /// (docs/transports.md). $DTRAIN_SHM_RING_BYTES.
  std::size_t ring_bytes = std::size_t{256} << 10;
  /// Messages of at least this many bytes are read by the receiver straight from the sender's
  /// memory (process_vm_readv: one copy instead of two through a ring), to each peer whose
  /// memory this kernel lets its peers read; 0 sends everything through the rings. The kernel
  /// pins pages for each read, so below some MiB the pipelined rings are faster; the read also
  /// waits for its receive, so a huge early message is never held twice. $DTRAIN_SHM_SINGLE_COPY_BYTES.
  std::size_t single_copy_bytes = std::size_t{16} << 20;
  /// Largest message sent or accepted (as over TCP).
  std::uint64_t max_message_bytes = std::uint64_t{1} << 30;
  /// The job token; unset: $DTRAIN_TOKEN, else the file $DTRAIN_TOKEN_FILE.
  std::optional<std::string> token;
  /// A peer that dies fails the whole group (what collectives need); off for a parameter server.
  bool abort_group_on_peer_loss = true;
  /// Rendezvous epoch: a group rebuilt without restarting uses a new one.
  std::uint64_t epoch = 0;
  /// Prefix of the store keys: distinguishes the groups of several hosts that share one store.
  std::string group_key = "shm/";
  /// The names of this group's ranks in messages (their world ranks, where the group is one
  /// host's part of a larger one); empty: as numbered here.
  std::vector<int> rank_names;

  /// The options with DTRAIN_SHM_RING_BYTES, DTRAIN_SHM_SINGLE_COPY_BYTES and DTRAIN_TIMEOUT_MS
  /// applied.
  shm_options with_environment() const {
    shm_options o = *this;
    if (const char* r = std::getenv("DTRAIN_SHM_RING_BYTES")) {
      o.ring_bytes = static_cast<std::size_t>(detail::env::to_int("DTRAIN_SHM_RING_BYTES", r));
    }
    if (const char* b = std::getenv("DTRAIN_SHM_SINGLE_COPY_BYTES")) {
      o.single_copy_bytes = static_cast<std::size_t>(detail::env::to_int("DTRAIN_SHM_SINGLE_COPY_BYTES", b));
    }
    if (const char* t = std::getenv("DTRAIN_TIMEOUT_MS")) {
      o.timeout = std::chrono::milliseconds(detail::env::to_int("DTRAIN_TIMEOUT_MS", t));
    }
    return o;
  }
};

}  // namespace dtrain
