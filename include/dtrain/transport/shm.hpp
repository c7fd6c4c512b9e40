#pragma once
/// @file
/// `shm_transport`: the ranks of a group are processes of one host, joined by rings in shared
/// memory. Link `dtrain::asio` (the rendezvous store and the token's HMAC).
///
/// ```cpp
/// auto t = dtrain::shm_transport::from_environment();  // dtrain-run, mpirun, srun, torchrun
/// dtrain::communicator<dtrain::shm_transport> comm(std::move(t));
/// ```
/// Each rank creates one inbox segment holding a ring per sender, publishes its name through the
/// store, maps every peer's inbox, and unlinks its own once all ranks have mapped theirs: from
/// then on no name is left in /dev/shm. See docs/transports.md for the layout and protocol.

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/core/deadline.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/memory_space.hpp"
#include "dtrain/detail/log.hpp"
#include "dtrain/net/auth.hpp"
#include "dtrain/rendezvous/environment.hpp"
#include "dtrain/rendezvous/launch_store.hpp"
#include "dtrain/rendezvous/store.hpp"
#include "dtrain/transport/buffer_forms.hpp"
#include "dtrain/transport/engine_handle.hpp"
#include "dtrain/transport/progress.hpp"
#include "dtrain/transport/request.hpp"
#include "dtrain/transport/shm/engine.hpp"
#include "dtrain/transport/shm/options.hpp"
#include "dtrain/transport/shm/stats.hpp"

namespace dtrain {

/// The completion handle of a shared-memory send or receive (a model of `completion`).
template <class Progress>
using basic_shm_request = transport_request<detail::shm::engine, detail::byte_operation, Progress>;

/// One rank's endpoint of a shared-memory group (a model of `transport`). Move-only; destroying
/// it leaves the group after everything it sent is in the peers' rings.
/// @tparam Progress how waiting threads wait: `default_progress` (spins only where this host has two
///   cores per rank), `blocking` or `spin_then_block<us>` (progress.hpp).
namespace detail::shm {
struct raw_writer;
}

template <class Progress = default_progress>
class basic_shm_transport
    : public detail::engine_handle<basic_shm_transport<Progress>, detail::shm::engine, basic_shm_request<Progress>> {
  using handle = detail::engine_handle<basic_shm_transport, detail::shm::engine, basic_shm_request<Progress>>;

 public:
  using memory_space = host_memory;
  using typename handle::request;

  /// Forms the group of `size` ranks of this host through `store`.
  /// @throws dtrain::error naming the rank whose inbox cannot be mapped or whose token differs
  template <class Store>
  static basic_shm_transport connect(Store& store, int rank, int size, shm_options options = {}) {
    using namespace detail::shm;
    if (size < 1 || rank < 0 || rank >= size) {
      throw error(errc::invalid_argument, "dtrain: rank " + std::to_string(rank) + " of a group of " +
                                              std::to_string(size));
    }
    const std::size_t ring = options.ring_bytes;
    if (ring < 4096 || (ring & (ring - 1)) != 0) {
      throw error(errc::invalid_argument, "dtrain: a shared-memory ring of " + std::to_string(ring) +
                                              " bytes (a power of two of at least 4096 is needed)");
    }
    const deadline d = deadline::after(options.timeout);
    const std::string token = detail::auth::load_token(options.token);
    const int pid = static_cast<int>(::getpid());
    const auto name_of = [&](int r) {
      return "rank " + std::to_string(options.rank_names.empty() ? r : options.rank_names[static_cast<std::size_t>(r)]);
    };

    segment own = segment::create(inbox_bytes(size, ring));
    auto* h = new (own.data()) inbox_header;
    h->size = static_cast<std::uint32_t>(size);
    h->rank = rank;
    h->pid = pid;
    h->ring_bytes = ring;
    h->epoch = options.epoch;
    h->probe_address = reinterpret_cast<std::uint64_t>(own.data());
    const auto proof = detail::auth::hmac(token, proof_text(own.name(), rank, pid, options.epoch));
    std::memcpy(h->proof, proof.data(), proof.size());
    for (int s = 0; s < size; ++s) new (ring_at(own.data(), s, ring)) ring_control;
    std::atomic_thread_fence(std::memory_order_release);
    h->magic = inbox_header::magic_value;

    const auto key = [&](const std::string& k) { return epoch_key(options.epoch, options.group_key + k); };
    store.set(key(std::to_string(rank)), as_value(own.name() + " " + std::to_string(pid) + " " + std::to_string(ring)),
              d);
    std::vector<segment> inboxes(static_cast<std::size_t>(size));
    std::vector<std::string> fallbacks;
    std::vector<int> pids(static_cast<std::size_t>(size), 0);
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      std::istringstream where(value_text(get_published_by(store, key(std::to_string(p)), name_of(p), d)));
      std::string name;
      std::size_t their_ring = 0;
      int their_pid = 0;
      where >> name >> their_pid >> their_ring;
      if (their_ring != ring) {
        throw error(errc::invalid_argument, "dtrain: " + name_of(p) + " uses shared-memory rings of " +
                                                std::to_string(their_ring) + " bytes, " + name_of(rank) + " of " +
                                                std::to_string(ring) + " (set DTRAIN_SHM_RING_BYTES alike)");
      }
      segment s = segment::open(name, inbox_bytes(size, ring), name_of(p));
      check_inbox(s, p, name_of(p), size, their_pid, options.epoch, token);
      // The single-copy path from p: this rank reads p's memory, if the kernel lets it.
      std::string why;
      const auto* their = reinterpret_cast<const inbox_header*>(s.data());
      const bool readable = options.single_copy_bytes > 0 &&
                            can_read_process(their_pid, their->probe_address, inbox_header::magic_value, why);
      ring_at(own.data(), p, ring)->single_copy.store(readable ? 1 : 0);
      if (!readable && options.single_copy_bytes > 0) {
        fallbacks.push_back(name_of(rank) + " cannot read " + name_of(p) + "'s memory (" + why +
                            "): its large messages go through the ring");
        detail::log(detail::log_level::warn, fallbacks.back());
      }
      pids[static_cast<std::size_t>(p)] = their_pid;
      inboxes[static_cast<std::size_t>(p)] = std::move(s);
    }
    // Once every rank has mapped every inbox, the names go: a job that dies later leaves nothing.
    if (store.add(key("mapped"), 1, d) == size) store.set(key("mapped/all"), as_value("1"), d);
    store.get(key("mapped/all"), d);
    own.unlink();

    settings s{options, std::move(fallbacks)};
    s.options.ring_bytes = ring;
    s.options.token.reset();  // proven; the engine has no use for the secret
    auto e = std::make_shared<engine>(rank, size, s, std::move(own), std::move(inboxes), pids);
    e->start();
    return basic_shm_transport(std::move(e));
  }

  /// Forms the group the launcher describes (see `with_launch_store`); every rank must be on
  /// this host. DTRAIN_SHM_RING_BYTES, DTRAIN_SHM_SINGLE_COPY_BYTES and DTRAIN_TIMEOUT_MS
  /// override the options.
  static basic_shm_transport from_environment(shm_options options = {}) {
    options = options.with_environment();
    options.token = detail::auth::load_token(options.token);
    auto formed = with_launch_store(options.timeout, *options.token, "", [](const std::string& host) { return host; },
                                    [&](auto& store, const launch_environment& env) {
                                      return connect(store, env.rank, env.size, options);
                                    });
    formed.value.keepalive_ = std::move(formed.server);
    return std::move(formed.value);
  }


  /// What this rank has sent through the rings and by single copy, and the peers whose large
  /// messages fall back to the ring because the kernel refused this rank reading their memory.
  shm_stats stats() const { return this->engine_->stats(); }

  friend struct detail::shm::raw_writer;

 private:
  explicit basic_shm_transport(std::shared_ptr<detail::shm::engine> e) : handle(std::move(e)) {}

  static std::string proof_text(const std::string& name, int rank, int pid, std::uint64_t epoch) {
    return "dtrain shm inbox " + name + " " + std::to_string(rank) + " " + std::to_string(pid) + " " +
           std::to_string(epoch);
  }

  // A peer's inbox is trusted once it says who made it and proves the maker holds the token.
  static void check_inbox(const detail::shm::segment& s, int peer, const std::string& peer_name, int size, int pid,
                          std::uint64_t epoch, const std::string& token) {
    const auto* h = reinterpret_cast<const detail::shm::inbox_header*>(s.data());
    const std::string who = peer_name + "'s shared memory " + s.name();
    if (h->magic != detail::shm::inbox_header::magic_value || h->size != static_cast<std::uint32_t>(size) ||
        h->rank != peer || h->pid != pid || h->epoch != epoch) {
      throw error(errc::protocol_error, "dtrain: " + who + " is not the inbox it was announced as");
    }
    detail::auth::mac proof{};
    std::memcpy(proof.data(), h->proof, proof.size());
    if (!detail::auth::same(proof, detail::auth::hmac(token, proof_text(s.name(), peer, pid, epoch)))) {
      throw error(errc::auth_failed, "dtrain: " + who + " was not made with this job's token");
    }
  }

};

using shm_transport = basic_shm_transport<default_progress>;
using shm_request = basic_shm_request<default_progress>;

namespace detail::shm {
/// Writes `bytes` unframed into `t`'s ring to `peer`, as a corrupt or hostile peer would: for the
/// fault tests only, so it is not the transport's API. @pre peer != t.rank()
struct raw_writer {
  template <class Progress>
  static void write(basic_shm_transport<Progress>& t, int peer, std::span<const std::byte> bytes) {
    t.engine_->write_raw_for_testing(peer, bytes);
  }
};
}  // namespace detail::shm

}  // namespace dtrain
