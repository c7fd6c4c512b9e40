#pragma once
// What one rank's shared-memory endpoint sent, by path, and where single copy fell back.

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain {

/// What one rank of a shared-memory group has sent, by path (`basic_shm_transport::stats()`), so a
/// test or a user can see which path large messages took. Messages to itself are not counted.
struct shm_stats {
  std::uint64_t ring_messages = 0;         ///< data messages written through a ring
  std::uint64_t ring_bytes = 0;            ///< their payload bytes
  std::uint64_t single_copy_messages = 0;  ///< data messages the receiver read from this rank's memory
  std::uint64_t single_copy_bytes = 0;     ///< their payload bytes
  /// Data messages at or above the single-copy threshold that went through a ring all the same
  /// (their receiver may not read this rank's memory); 0 where single copy is off.
  std::uint64_t large_ring_messages = 0;
  /// One line for each peer this rank may not read (the kernel refused `process_vm_readv`, with its
  /// reason), where single copy is on: that peer's large messages to this rank go through the ring.
  /// Empty where single copy is off (`single_copy_bytes` 0) or every peer is readable.
  std::vector<std::string> fallbacks;
};

}  // namespace dtrain
