#pragma once
/// @file
/// `mixed_transport`: shared memory to the ranks on this host, TCP to the others, chosen per
/// peer when the group forms from each rank's host identity (`this_host_id()`: DTRAIN_HOST_ID,
/// else the host name). Link `dtrain::asio`.
///
/// ```cpp
/// auto t = dtrain::mixed_transport::from_environment();  // DTRAIN_TRANSPORT=auto|tcp|shm
/// dtrain::communicator<dtrain::mixed_transport> comm(std::move(t));
/// ```
/// Every rank is on one host: shared memory alone. Ranks on several hosts: a TCP group of all
/// of them, and a shared-memory group of each host's ranks beside it; a message goes through one
/// of the two, so messages between two ranks keep their order. A receive from any peer is posted
/// in both; whichever transport matches a message first claims it, and the other drops its twin.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "dtrain/core/deadline.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/memory_space.hpp"
#include "dtrain/rendezvous/launch_store.hpp"
#include "dtrain/rendezvous/store.hpp"
#include "dtrain/topology/hosts.hpp"
#include "dtrain/transport/buffer_forms.hpp"
#include "dtrain/transport/mixed_request.hpp"
#include "dtrain/transport/progress.hpp"
#include "dtrain/transport/shm.hpp"
#include "dtrain/transport/tcp.hpp"

namespace dtrain {

/// Which path each peer takes.
enum class peer_path {
  automatic,  ///< shared memory on this host, TCP elsewhere
  tcp,        ///< TCP to every peer
  shm,        ///< shared memory to every peer (every rank must be on this host)
};

/// How a mixed group forms: the two transports' options and the choice of path.
struct mixed_options {
  tcp_options tcp;
  shm_options shm;
  peer_path path = peer_path::automatic;
  /// This rank's host identity; empty: `this_host_id()`. Ranks with equal ones share memory.
  std::string host_id;

  /// The options with the environment applied: DTRAIN_TRANSPORT (auto, tcp or shm) and each
  /// transport's own variables.
  mixed_options with_environment() const {
    mixed_options o = *this;
    o.tcp = tcp.with_environment();
    o.shm = shm.with_environment();
    if (const char* t = std::getenv("DTRAIN_TRANSPORT"); t != nullptr && *t != '\0') {
      const std::string v = t;
      if (v != "auto" && v != "tcp" && v != "shm") {
        throw error(errc::invalid_argument, "dtrain: DTRAIN_TRANSPORT=" + v + " (auto, tcp or shm)");
      }
      o.path = v == "tcp" ? peer_path::tcp : v == "shm" ? peer_path::shm : peer_path::automatic;
    }
    return o;
  }
};

/// One rank's endpoint of a mixed group (a model of `transport`).
template <class Progress = default_progress>
class basic_mixed_transport : public transport_buffer_forms<basic_mixed_transport<Progress>> {
 public:
  using transport_buffer_forms<basic_mixed_transport>::irecv;
  using transport_buffer_forms<basic_mixed_transport>::isend;
  using memory_space = host_memory;
  using tcp_type = basic_tcp_transport<Progress>;
  using shm_type = basic_shm_transport<Progress>;
  using request = mixed_request<typename tcp_type::request, typename shm_type::request>;

  /// Forms the group through `store`: every rank publishes its host; then the TCP group (if any
  /// rank is elsewhere) and this host's shared-memory group (if it holds more than this rank).
  /// @throws dtrain::error as the two transports do, or when `shm` is forced across hosts
  template <class Store>
  static basic_mixed_transport connect(Store& store, int rank, int size, mixed_options options = {},
                                       std::string route_hint = {}) {
    const deadline d = deadline::after(options.tcp.timeout);
    auto host_key = [&](int r) { return epoch_key(options.tcp.epoch, "host/" + std::to_string(r)); };
    // Late ranks (`tcp_options::late_ranks`) come after the shared-memory groups formed: they
    // talk TCP to everyone, and nobody waits for their host.
    const int formed = size - std::max(options.tcp.late_ranks, 0);
    auto alone = [&](int r) { return r >= formed || rank >= formed; };
    store.set(host_key(rank), as_value(options.host_id.empty() ? this_host_id() : options.host_id), d);
    std::vector<std::string> host(static_cast<std::size_t>(size));
    for (int r = 0; r < size; ++r) {
      if (r == rank || (!alone(r) && options.path != peer_path::tcp)) {
        host[static_cast<std::size_t>(r)] =
            value_text(get_published_by(store, host_key(r), "rank " + std::to_string(r), d));
      }
    }
    const std::string& mine = host[static_cast<std::size_t>(rank)];
    basic_mixed_transport t;
    t.rank_ = rank;
    t.size_ = size;
    t.local_of_.assign(static_cast<std::size_t>(size), -1);
    int local_rank = 0, local_size = 0;
    auto world = std::make_shared<std::vector<int>>();  // this host's ranks, by local rank
    for (int r = 0; r < size; ++r) {
      if (host[static_cast<std::size_t>(r)] != mine || options.path == peer_path::tcp || (r != rank && alone(r)))
        continue;
      if (r == rank) local_rank = local_size;
      t.local_of_[static_cast<std::size_t>(r)] = local_size++;
      world->push_back(r);
    }
    if (options.path == peer_path::shm && local_size != size) {
      throw error(errc::invalid_argument, "dtrain: DTRAIN_TRANSPORT=shm, but only " + std::to_string(local_size) +
                                              " of the " + std::to_string(size) + " ranks run on host " + mine);
    }
    if (local_size < size) t.tcp_.emplace(tcp_type::connect(store, rank, size, options.tcp, route_hint));
    if (local_size > 1 || !t.tcp_) {  // (a group of one rank sends to itself through it)
      options.shm.group_key = "shm/" + std::to_string(world->front()) + "/";
      options.shm.epoch = options.tcp.epoch;
      options.shm.rank_names = *world;
      t.shm_.emplace(shm_type::connect(store, local_rank, local_size, options.shm));
    }
    t.world_of_ = std::move(world);
    return t;
  }

  /// Forms the group the launcher describes (see `with_launch_store`).
  static basic_mixed_transport from_environment(mixed_options options = {}) {
    options = options.with_environment();
    options.tcp.token = detail::auth::load_token(options.tcp.token);
    options.shm.token = options.tcp.token;
    auto formed = with_launch_store(options.tcp.timeout, *options.tcp.token, options.tcp.bind_address,
                                    [](const std::string& h) { return h; },
                                    [&](auto& store, const launch_environment& env) {
                                      return connect(store, env.rank, env.size, options, env.store_host);
                                    });
    formed.value.keepalive_ = std::move(formed.server);
    return std::move(formed.value);
  }

  basic_mixed_transport(basic_mixed_transport&&) noexcept = default;
  basic_mixed_transport& operator=(basic_mixed_transport&&) noexcept = default;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }

  /// Whether this host has two cores for each of the group's ranks on it (progress.hpp): its
  /// shared-memory group's answer, or where it has none (alone here) the TCP group's.
  bool spare_cores() const noexcept { return shm_ ? shm_->spare_cores() : tcp_ && tcp_->spare_cores(); }

  /// Whether messages to `peer` (this rank too) go through shared memory.
  bool through_shm(int peer) const noexcept { return local_of_[static_cast<std::size_t>(peer)] >= 0 && shm_; }
  /// What this rank sent to the ranks of its host, by path; none where it shares its host with none.
  std::optional<shm_stats> host_stats() const { return shm_ ? std::optional(shm_->stats()) : std::nullopt; }

  /// Starts sending to `peer` through the path chosen for it. @pre 0 <= peer < size()
  request isend(int peer, std::uint64_t tag, const signature& sig, gather_list parts) {
    DTRAIN_ASSERT(peer >= 0 && peer < size(), "send to a rank outside the group");
    if (through_shm(peer)) return request(shm_->isend(local(peer), tag, sig, parts), world_of_, true);
    return request(tcp_->isend(peer, tag, sig, parts), true);
  }

  /// Starts receiving from `peer` through its path, or from any peer through both.
  request irecv(int peer, std::uint64_t tag, scatter_list parts, std::vector<std::byte>* overflow) {
    DTRAIN_ASSERT(peer == any_peer || (peer >= 0 && peer < size()), "receive from a rank outside the group");
    if (peer != any_peer) {
      if (through_shm(peer)) return request(shm_->irecv(local(peer), tag, parts, overflow), world_of_, false);
      return request(tcp_->irecv(peer, tag, parts, overflow), false);
    }
    if (!tcp_) return request(shm_->irecv(any_peer, tag, parts, overflow), world_of_, false);
    if (!shm_) return request(tcp_->irecv(any_peer, tag, parts, overflow), false);
    // Both may match; the claim decides which does. Each writes only once it has claimed.
    auto claim = std::make_shared<std::atomic<bool>>(false);
    auto on_tcp = tcp_->irecv_claimed(any_peer, tag, parts, overflow, claim);
    auto on_shm = shm_->irecv_claimed(any_peer, tag, parts, overflow, claim);
    return request(std::move(on_tcp), std::move(on_shm), world_of_);
  }

  /// Fails the group on every rank, telling each peer `why`, through both paths (see
  /// `engine_handle::abort`).
  void abort(const std::string& why, errc code = errc::peer_lost) noexcept {
    if (shm_) shm_->abort(why, code);
    if (tcp_) tcp_->abort(why, code);
  }

  /// Why the group failed; empty while it is healthy.
  std::string failure() const {
    std::string why = tcp_ ? tcp_->failure() : std::string();
    return why.empty() && shm_ ? shm_->failure() : why;
  }

 private:
  basic_mixed_transport() = default;

  int local(int peer) const noexcept { return local_of_[static_cast<std::size_t>(peer)]; }

  int rank_ = 0, size_ = 0;
  std::vector<int> local_of_;  // per world rank: its local rank on this host, or -1 (through TCP)
  std::shared_ptr<const std::vector<int>> world_of_;  // by local rank: its world rank (renames envelopes)
  std::optional<tcp_type> tcp_;
  std::optional<shm_type> shm_;
  std::shared_ptr<void> keepalive_;  // the store server rank 0 hosts for the group's lifetime
};

using mixed_transport = basic_mixed_transport<default_progress>;

}  // namespace dtrain
