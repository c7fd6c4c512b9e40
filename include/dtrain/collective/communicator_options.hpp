#pragma once
/// @file
/// `communicator_options`: how a host communicator (collective/communicator.hpp) runs its
/// collectives: the deadline of each call, its transport tag, the pipeline segment and the
/// algorithm rules. The staged and hierarchical communicators take the same options.

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "dtrain/collective/selection.hpp"

namespace dtrain {

/// How a communicator runs its collectives.
struct communicator_options {
  /// Deadline of each call, from its start. A call that cannot finish in time raises
  /// `errc::timeout` naming the operation, its sequence number and the peer it waited for.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  /// The transport tag all of this communicator's messages use. Two communicators over one
  /// transport need different tags.
  std::uint64_t tag = 0x647472'61696e00;  // "dtrain\0"
  /// Pipeline granularity of the ring and tree algorithms.
  std::size_t segment_bytes = std::size_t{1} << 20;
  /// Algorithm rules and cost model. The environment variable DTRAIN_ALGORITHMS (same syntax as
  /// `selection_table::parse`) adds rules that take precedence over these.
  selection_table algorithms{};
};

}  // namespace dtrain
