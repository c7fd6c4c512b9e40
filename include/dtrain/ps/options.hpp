#pragma once
/// @file
/// `ps_options`: the tags, timings, key caching and checkpoints that servers and workers share.
/// Its own header so that a worker does not include the server to get them.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace dtrain::ps {

/// What a server does when a worker stops sending (no heartbeat within the timeout).
enum class dead_worker_policy {
  abort,  ///< fail: every waiting worker gets an error naming the dead one, and `run` throws
  drop,   ///< go on without it (sensible under ASP, SSP and soft sync): it no longer holds anyone back
};

/// Tags and timings shared by servers and workers.
struct ps_options {
  /// Requests use `tag`; the reply to request i uses `reply_tag(tag, i)`, `tag + 1 + i`; servers
  /// watch each other for losses on `tag - 1`. Give other traffic on the same transport tags
  /// outside [tag - 1, tag + 1 + requests].
  std::uint64_t tag = 0x70735f7265710000;  // "ps_req"
  /// How often workers send heartbeats, and how long a server waits before declaring one dead.
  std::chrono::milliseconds heartbeat_interval{1000};
  std::chrono::milliseconds heartbeat_timeout{10000};
  /// Deadline for start-up (every worker's hello) and for each wait of a worker.
  std::chrono::milliseconds timeout{60000};
  dead_worker_policy on_dead_worker = dead_worker_policy::abort;
  /// How long a server looks for the next request before it sleeps (0: never spins).
  std::chrono::microseconds spin{50};
  /// How many request receives a server keeps posted. Each holds a buffer as large as the largest
  /// request it took (up to a dense slice), so the server's memory grows by up to this many slices;
  /// requests beyond it still arrive, through the transport's unexpected queue (a copy each).
  std::size_t posted_requests = 8;
  /// Dense tensors are cut into slices of at most this many bytes, spread over the servers.
  std::size_t dense_slice_bytes = std::size_t{4} << 20;
  /// Key caching: a worker remembers the last `key_cache_lists` sparse key lists of at least
  /// `key_cache_min_keys` keys it sent each server (so does the server), and sends a list that
  /// comes again as a one-byte slot; the server then skips the keys' hash lookups too.
  /// At most 256; 0 turns it off.
  std::size_t key_cache_lists = 16;
  std::size_t key_cache_min_keys = 1024;
  /// Checkpoints: server s writes `<checkpoint_prefix>.shard<s>.c<clock>.sparse` and `.dense`
  /// (atomically) every `checkpoint_every` clocks under a barrier model, at a round boundary, so
  /// the shards' checkpoints of one clock form a consistent cut; and when a worker asks. The two
  /// newest clocks are kept: a shard that died may not have written the newest one. Empty: none.
  std::string checkpoint_prefix;
  std::int64_t checkpoint_every = 0;
  /// Start from the checkpoints of clock `resume_clock` (-1: the newest clock every shard has a
  /// checkpoint of, found in the checkpoint directory; name the clock when shards write to
  /// different disks). Workers then continue from that clock (`worker::clocks()`).
  bool resume = false;
  std::int64_t resume_clock = -1;
  /// Copies of each shard, on as many servers (chain replication, ps/chain.hpp): 1 keeps one
  /// copy; k > 1 survives k - 1 lost servers of a chain, without a restart (fail-over; needs a
  /// transport that does not fail the whole group when one peer is lost, e.g. TCP with
  /// `abort_group_on_peer_loss = false`). At most the number of servers.
  int replicas = 1;
};

}  // namespace dtrain::ps
