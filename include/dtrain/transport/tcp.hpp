#pragma once
/// @file
/// `tcp_transport`: the ranks of a group are processes, on one machine or many, joined by TCP
/// through Boost.Asio. Link `dtrain::asio` (Boost headers, OpenSSL's libcrypto).
///
/// ```cpp
/// auto t = dtrain::tcp_transport::from_environment();  // dtrain-run, mpirun, srun, torchrun
/// dtrain::communicator<dtrain::tcp_transport> comm(std::move(t));
/// comm.allreduce(std::span(grads), dtrain::reduce_op::sum);
/// ```
/// Each pair of ranks shares one connection; every connection is authenticated with the job
/// token (see docs/launching.md). Frames follow core/frame.hpp. See docs/transports.md for the
/// data path, failure behaviour and shutdown.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <unistd.h>
#include <utility>
#include <vector>

#include "dtrain/concepts/completion.hpp"
#include "dtrain/core/deadline.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/memory_space.hpp"
#include "dtrain/detail/request_error.hpp"
#include "dtrain/net/netif.hpp"
#include "dtrain/rendezvous/environment.hpp"
#include "dtrain/rendezvous/launch_store.hpp"
#include "dtrain/rendezvous/store.hpp"
#include "dtrain/transport/buffer_forms.hpp"
#include "dtrain/transport/engine_handle.hpp"
#include "dtrain/transport/progress.hpp"
#include "dtrain/transport/request.hpp"
#include "dtrain/transport/tcp/engine.hpp"

namespace dtrain {

/// How a TCP group is formed and behaves. Fields left empty are taken from the environment by
/// `from_environment` (DTRAIN_IFNAME, DTRAIN_BIND_ADDR, DTRAIN_ADVERTISE_ADDR, DTRAIN_PORT,
/// DTRAIN_LATE_RANKS, DTRAIN_EPOCH).
struct tcp_options {
  /// Deadline for forming the group: rendezvous, connecting, handshakes.
  std::chrono::milliseconds timeout{60000};
  /// How long shutdown waits for peers to confirm they have read everything sent to them.
  std::chrono::milliseconds linger{10000};
  /// Interface whose address is advertised to peers ("eth0"); empty: see `advertise_address`.
  std::string interface;
  /// Address advertised to peers (an IP or a hostname). Empty: the address of `interface`, else
  /// the local address that routes to the rendezvous store, else the host name's address.
  std::string advertise_address;
  /// Address the listening socket binds to. Empty: the advertised address (one interface, not
  /// all); "0.0.0.0" listens on every interface, which must be asked for.
  std::string bind_address;
  std::uint16_t port = 0;  ///< listening port; 0 picks a free one
  /// Largest frame payload accepted or sent. Larger incoming frames close the connection.
  std::uint64_t max_frame_bytes = std::uint64_t{1} << 30;
  /// SO_SNDBUF/SO_RCVBUF; 0 keeps the kernel's autotuning (usually the faster choice).
  int socket_buffer_bytes = 0;
  /// The job token; unset: $DTRAIN_TOKEN, else the file $DTRAIN_TOKEN_FILE.
  std::optional<std::string> token;
  /// A lost peer fails the whole group at once, on every rank (what collectives need). Off for
  /// a parameter server that outlives its workers.
  bool abort_group_on_peer_loss = true;
  /// Rendezvous epoch: a group rebuilt without restarting uses a new epoch, so its keys and
  /// handshakes never mix with the old group's. Each rank joins an epoch's group once.
  std::uint64_t epoch = 0;
  /// The highest `late_ranks` ranks may join after the group has formed (standby servers that
  /// start later, say): the others form the group without them, sends to one queue until it
  /// connects, and a late rank counts a rank that no longer answers as lost. Every rank must
  /// pass the same value; the rendezvous store must still be there when a late rank comes.
  int late_ranks = 0;

  /// The options with the environment's DTRAIN_* settings filled in where these are empty.
  tcp_options with_environment() const {
    tcp_options o = *this;
    auto pick = [](std::string& field, const char* name) {
      if (const char* v = std::getenv(name); field.empty() && v != nullptr) field = v;
    };
    pick(o.interface, "DTRAIN_IFNAME");
    pick(o.advertise_address, "DTRAIN_ADVERTISE_ADDR");
    pick(o.bind_address, "DTRAIN_BIND_ADDR");
    if (const char* p = std::getenv("DTRAIN_PORT"); o.port == 0 && p != nullptr) {
      o.port = detail::env::to_port("DTRAIN_PORT", p);
    }
    if (const char* b = std::getenv("DTRAIN_SOCKET_BUFFER"); o.socket_buffer_bytes == 0 && b != nullptr) {
      o.socket_buffer_bytes = detail::env::to_int("DTRAIN_SOCKET_BUFFER", b);
    }
    if (const char* l = std::getenv("DTRAIN_LATE_RANKS"); o.late_ranks == 0 && l != nullptr) {
      o.late_ranks = detail::env::to_int("DTRAIN_LATE_RANKS", l);
    }
    if (const char* e = std::getenv("DTRAIN_EPOCH"); o.epoch == 0 && e != nullptr) {
      o.epoch = static_cast<std::uint64_t>(detail::env::to_int("DTRAIN_EPOCH", e));
    }
    if (const char* t = std::getenv("DTRAIN_TIMEOUT_MS")) {
      o.timeout = std::chrono::milliseconds(detail::env::to_int("DTRAIN_TIMEOUT_MS", t));
    }
    return o;
  }
};

/// The completion handle of a TCP send or receive (a model of `completion`); `detail()` says
/// what went wrong on the wire.
template <class Progress>
using basic_tcp_request = transport_request<detail::tcp_engine::engine, detail::tcp_engine::operation, Progress>;

/// One rank's endpoint of a TCP group (a model of `transport`). Move-only; destroying it shuts
/// down gracefully: queued sends are flushed and every peer confirms it has read them before the
/// connections close, so a rank may exit right after its last collective.
/// @tparam Progress how waiting threads wait: `default_progress` (spins only where this host has two
///   cores per rank), `blocking` or `spin_then_block<us>` (progress.hpp).
template <class Progress = default_progress>
class basic_tcp_transport : public detail::engine_handle<basic_tcp_transport<Progress>, detail::tcp_engine::engine,
                                                         basic_tcp_request<Progress>> {
  using handle = detail::engine_handle<basic_tcp_transport, detail::tcp_engine::engine, basic_tcp_request<Progress>>;

 public:
  using memory_space = host_memory;
  using typename handle::request;
  /// Halving-doubling's pieces (concepts/transport.hpp): each TCP message costs system calls and
  /// wake-ups that outweigh what cache-sized pieces save; with 4x shared memory's, allreduce at
  /// 1-16 MiB is 1.1-1.4x faster (docs/transports.md, "Larger pieces over TCP").
  static constexpr std::size_t reduce_piece_bytes = std::size_t{512} << 10;

  /// Frames (messages, goodbyes) the transport's reader thread read because no thread was
  /// waiting on their connection: they cost wake-ups of that thread (one may read several), and
  /// a copy each whose receive was not posted yet. A connection stays with its waiters until it
  /// has been idle for a millisecond, so collectives run back to back keep this near zero
  /// (docs/transports.md).
  std::uint64_t frames_read_by_reader() const noexcept {
    return this->engine_ ? this->engine_->frames_by_reader() : 0;
  }

  /// Forms the group of `size` ranks through `store`: publishes this rank's address, connects
  /// to every lower rank (retrying until the deadline), accepts every higher rank, and waits
  /// until all ranks are connected.
  /// @throws dtrain::error naming the ranks that did not connect, or why a peer was refused
  template <class Store>
  static basic_tcp_transport connect(Store& store, int rank, int size, tcp_options options = {},
                                     std::string route_hint = {}) {
    if (size < 1 || rank < 0 || rank >= size) {
      throw error(errc::invalid_argument, "dtrain: rank " + std::to_string(rank) + " of a group of " +
                                              std::to_string(size));
    }
    if (options.late_ranks < 0 || options.late_ranks >= size) {
      throw error(errc::invalid_argument, "dtrain: " + std::to_string(options.late_ranks) +
                                              " late ranks in a group of " + std::to_string(size) +
                                              "; at least one rank must form it");
    }
    const bool late = rank >= size - options.late_ranks;
    const deadline d = deadline::after(options.timeout);
    claim_rank(store, rank, options.epoch, d);
    detail::tcp_engine::settings s;
    s.handshake_timeout = std::min(options.timeout, std::chrono::milliseconds(10000));
    s.linger = options.linger;
    s.max_frame_bytes = options.max_frame_bytes;
    s.socket_buffer_bytes = options.socket_buffer_bytes;
    s.abort_group_on_peer_loss = options.abort_group_on_peer_loss;
    s.token = detail::auth::load_token(options.token);
    s.epoch = options.epoch;
    s.late_ranks = options.late_ranks;
    if (s.token.empty() && rank == 0 && size > 1) {
      detail::log(detail::log_level::warn,
                  "no job token (DTRAIN_TOKEN or DTRAIN_TOKEN_FILE): connections are not authenticated");
    }
    auto engine = std::make_shared<detail::tcp_engine::engine>(rank, size, std::move(s));

    std::string advertise = choose_address(options, route_hint);
    std::string advertise_ip = resolve_ip(advertise);  // a host name is resolved once
    std::string bind = options.bind_address.empty() ? advertise_ip : options.bind_address;
    std::uint16_t port = engine->listen(bind, options.port);
    detail::log(detail::log_level::info,
                "rank " + std::to_string(rank) + " listens on " + bind + ":" + std::to_string(port) +
                    " (interface " + detail::netif::name_of(advertise_ip) + "), advertised as " +
                    advertise + ":" + std::to_string(port));
    engine->start();
    store.set(epoch_key(options.epoch, "addr/" + std::to_string(rank)),
              as_value(advertise + ":" + std::to_string(port)), d);
    for (int peer = 0; peer < rank; ++peer) {
      auto where = value_text(get_published_by(store, epoch_key(options.epoch, "addr/" + std::to_string(peer)),
                                               "rank " + std::to_string(peer), d));
      auto colon = where.rfind(':');
      const auto peer_port = static_cast<std::uint16_t>(std::stoi(where.substr(colon + 1)));
      if (late) {
        engine->connect_late(peer, where.substr(0, colon), peer_port, d);
      } else {
        engine->connect_to(peer, where.substr(0, colon), peer_port, d);
      }
    }
    engine->wait_for_accepts(d, options.timeout);
    engine->close_listener();
    engine->count_ranks_here();
    if (late) return basic_tcp_transport(std::move(engine));  // the group formed without it
    // Nobody leaves before everyone is connected: rank 0 may be serving the store.
    std::string ready = epoch_key(options.epoch, "ready");
    if (store.add(ready, 1, d) == size - options.late_ranks) store.set(ready + "/all", as_value("1"), d);
    store.get(ready + "/all", d);
    return basic_tcp_transport(std::move(engine));
  }

  /// Each rank joins a group once: its place is claimed in the store before anything is
  /// published, so a second process for a rank (a stale one started again, a duplicate, or a
  /// store left by an earlier job) is refused before it can overwrite the first's address.
  /// @throws dtrain::error `invalid_argument` naming the rank and the epoch
  template <class Store>
  static void claim_rank(Store& store, int rank, std::uint64_t epoch, deadline d) {
    const std::int64_t claims = store.add(epoch_key(epoch, "claim/" + std::to_string(rank)), 1, d);
    if (claims == 1) return;
    throw error(errc::invalid_argument,
                "dtrain: rank " + std::to_string(rank) + " already joined the group of epoch " + std::to_string(epoch) +
                    " through this store; this process (claim " + std::to_string(claims) +
                    ") is refused: a rank joins once, so this is a stale or duplicate process or a store left by an "
                    "earlier job (a group formed again takes a new epoch: tcp_options::epoch, DTRAIN_EPOCH)");
  }

  /// Forms the group the launcher describes (see `detect_launch`): a file store when
  /// DTRAIN_STORE_DIR is set; otherwise a TCP store served by the launcher (DTRAIN_STORE) or by
  /// rank 0 at the master address and port.
  /// @throws dtrain::error when the environment is incomplete or the group cannot form
  static basic_tcp_transport from_environment(tcp_options options = {}) {
    options = options.with_environment();
    options.token = detail::auth::load_token(options.token);
    auto formed = with_launch_store(options.timeout, *options.token, options.bind_address, resolve_ip,
                                    [&](auto& store, const launch_environment& env) {
                                      return connect(store, env.rank, env.size, options, env.store_host);
                                    });
    formed.value.keepalive_ = std::move(formed.server);
    return std::move(formed.value);
  }



 private:
  explicit basic_tcp_transport(std::shared_ptr<detail::tcp_engine::engine> e) : handle(std::move(e)) {}

  static std::string resolve_ip(const std::string& host) {
    boost::system::error_code ec;
    auto addr = boost::asio::ip::make_address(host, ec);
    if (!ec) return addr.to_string();
    boost::asio::io_context io;
    detail::tcp::resolver r(io);
    auto results = r.resolve(detail::tcp::v4(), host, "", ec);
    if (ec || results.empty()) {
      throw error(errc::invalid_argument, "dtrain: cannot resolve host name '" + host + "': " + ec.message());
    }
    return results.begin()->endpoint().address().to_string();
  }

  static std::string choose_address(const tcp_options& o, const std::string& route_hint) {
    if (!o.interface.empty()) return detail::netif::address_of(o.interface);
    if (!o.advertise_address.empty()) return o.advertise_address;
    if (!route_hint.empty()) {
      if (auto a = detail::netif::source_address_towards(route_hint); !a.empty()) return a;
    }
    char host[256] = {};
    if (gethostname(host, sizeof host - 1) == 0) {
      if (auto a = detail::netif::source_address_towards(host); !a.empty()) return a;
    }
    return "127.0.0.1";
  }
};

using tcp_transport = basic_tcp_transport<default_progress>;
using tcp_request = basic_tcp_request<default_progress>;

}  // namespace dtrain
