#pragma once
/// @file
/// `ps::server_context`: what the shards a server holds share with it: the transport, the
/// reply queue, the chains as this server sees them, the statistics, and the request being
/// handled (whose buffer a copy down a chain may take instead of copying its values).

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "dtrain/concepts/transport.hpp"
#include "dtrain/detail/receive_ring.hpp"
#include "dtrain/ps/chain.hpp"
#include "dtrain/ps/options.hpp"
#include "dtrain/ps/protocol.hpp"
#include "dtrain/ps/replication.hpp"
#include "dtrain/ps/reply_queue.hpp"
#include "dtrain/ps/roles.hpp"
#include "dtrain/ps/stats.hpp"

namespace dtrain::ps {

template <transport Transport>
struct server_context {
  Transport transport;
  roles group;
  ps_options options;
  chain_layout layout;
  reply_queue<Transport> replies;
  server_stats stats;
  replication_stats replication;
  dtrain::detail::receive_ring<Transport>* ring = nullptr;  // while the server runs
  std::vector<std::byte>* kept_message = nullptr;           // a request handled after it was kept back

  server_context(Transport t, roles r, ps_options o)
      : transport(std::move(t)),
        group(r),
        options(std::move(o)),
        layout(r.servers, options.replicas, r.shard_count()),
        replies(options.tag) {}

  int me() const noexcept { return transport.rank(); }

  /// The header of this server's answer to request `id` (of kind `what`) for `shard`.
  response_header answer_to(op what, std::uint64_t id, std::uint32_t shard) const {
    response_header h{what, 0, id, 0, 0, 0, static_cast<std::uint32_t>(me())};
    h.shard = shard;
    return h;
  }

  /// Sends a reply now (a shard holds it first while its chain's tail lacks an update).
  void send_now(int to, message bytes) { stats.bytes_out += replies.send(transport, to, std::move(bytes)); }

  /// Asks server `to` something about `shard` that carries nothing else (a join, a hand-over).
  template <class T>
  void ask_server(int to, op what, std::uint32_t shard) {
    request_header h{what, table_id::sparse, 0, 0, 0, 0, 0, 0};
    h.shard = shard;
    replies.send_request(transport, to, encode_request<T>(h, {}, std::span<const T>{}));
  }

  /// The buffer of the request being handled, leaving `spare` in its place.
  std::vector<std::byte> take_message(std::vector<std::byte> spare) {
    if (kept_message != nullptr) return std::exchange(*kept_message, {});
    return ring != nullptr ? ring->take_message(std::move(spare)) : std::vector<std::byte>{};
  }
};

}  // namespace dtrain::ps
