#pragma once
/// @file
/// `ps::server`: one shard of a parameter server. It holds a sparse table and a dense table
/// (dense tensors arrive as slices), applies pushes as its consistency model says, answers pulls
/// once the model allows, holds back workers that run too far ahead, measures the staleness of
/// every update and hands it to the updater, and watches its workers' heartbeats.
///
/// Consistency (per shard, with a clock per worker; clocks count `clock` requests):
///  - A push belongs to its worker's current clock. Under a barrier model (`bsp`) the pushes of
///    clock c are combined, in worker order, and applied once every worker has finished c,
///    averaged over the workers. When `pushes_to_apply(workers)` is 1 (`asp`, `ssp`) a push is
///    applied on arrival. Otherwise (`soft_sync<s>`) a worker's pushes of one clock form one
///    contribution when the clock ends, and the server applies the mean of every s.
///  - A pull from a worker at clock c is answered once every live worker has finished the clocks
///    up to `visible_clock(c)`.
///  - The reply to a worker's `clock` waits until `may_advance(its clocks, slowest's clocks)`.
///  - Staleness of a push: the server's version (updates applied) when it is applied, minus the
///    version the worker last pulled. Averaged pushes carry their mean staleness.
///
/// With `ps_options::replicas` k > 1, server s is the head of shard s's chain and holds copies
/// of the k-1 shards before it (ps/replication.hpp): every update it applies goes down its chain,
/// and it replies only from state the chain's tail holds.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <list>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/concepts/consistency.hpp"
#include "dtrain/concepts/transport.hpp"
#include "dtrain/concepts/updater.hpp"
#include "dtrain/core/deadline.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/signature.hpp"
#include "dtrain/detail/log.hpp"
#include "dtrain/detail/receive_ring.hpp"
#include "dtrain/ps/checkpoint.hpp"
#include "dtrain/ps/configuration.hpp"
#include "dtrain/ps/key_cache.hpp"
#include "dtrain/ps/options.hpp"
#include "dtrain/ps/protocol.hpp"
#include "dtrain/ps/push_rounds.hpp"
#include "dtrain/ps/replication.hpp"
#include "dtrain/ps/shard_updates.hpp"
#include "dtrain/ps/reply_queue.hpp"
#include "dtrain/ps/roles.hpp"
#include "dtrain/ps/shard_checkpoints.hpp"
#include "dtrain/ps/stats.hpp"
#include "dtrain/ps/table.hpp"
#include "dtrain/ps/worker_clocks.hpp"

namespace dtrain::ps {

/// One parameter-server shard over `Transport`.
template <transport Transport, consistency Consistency, std::floating_point T, updater<T> Updater,
          initializer<T> Initializer = zero_initializer>
  requires std::copy_constructible<Updater>
class server {
 public:
  /// @param t this rank's endpoint; its rank must be a server rank of `r`
  server(Transport t, roles r, Consistency c, Updater u, Initializer init = {}, ps_options o = {},
         apply_mode mode = apply_mode::update)
      : transport_(std::move(t)),
        roles_(r),
        consistency_(c),
        options_(o),
        checkpoints_(o.checkpoint_prefix, transport_.rank(), r.servers, o.checkpoint_every),
        replies_(o.tag),
        updates_(std::move(u), std::move(init), mode,
                 chain_replicator<Transport, T>(chain_layout(r.servers, o.replicas), transport_.rank(), o.tag, o.timeout), stats_),
        workers_(r.workers),
        key_cache_(r.workers) {
    if (!roles_.is_server(transport_.rank())) {
      throw error(errc::invalid_argument, "ps::server on rank " + std::to_string(transport_.rank()) +
                                              ", which is a worker rank");
    }
    stats_.per_worker_staleness.assign(static_cast<std::size_t>(r.workers), std::vector<std::uint64_t>(33, 0));
    if (options_.resume) restore();
    checkpoints_.start_after(workers_.slowest());
  }

  /// Serves until every worker has said goodbye (or was dropped).
  /// @throws dtrain::error `timeout` naming the workers that never said hello; `peer_lost`
  ///   naming a worker that went silent (policy `abort`); the transport's errors.
  void run() {
    const auto start = clock::now();
    // Several receives stay posted, so the workers' pipelined requests (a sliced tensor's, or
    // many tensors') land in place instead of in the transport's unexpected queue.
    dtrain::detail::receive_ring<Transport> requests;
    requests.start(transport_, any_peer, options_.tag, options_.posted_requests);
    ring_ = &requests;
    for (;;) {
      std::error_code ec;
      if (requests.wait_current(options_.spin, std::chrono::milliseconds(20), ec)) {
        const int from = requests.current().info().peer;
        stats_.bytes_in += requests.message().size();
        handle(from, std::span<const std::byte>(requests.message()));
        requests.advance();
      } else if (ec != errc::timeout) {
        throw error(ec, "ps::server " + std::to_string(transport_.rank()) + ": receiving requests");
      }
      reap_sends();
      check_liveness(start);
      if (const std::string late = chain().overdue(); !late.empty()) fail(errc::timeout, late);
      if (workers_.live() == 0 && chain().finished(transport_)) break;
    }
    requests.cancel();
    ring_ = nullptr;
    flush_sends();
  }

  /// What the server has done so far. Not synchronised: read it from the thread that runs
  /// `run`, or after `run` returns.
  const server_stats& stats() noexcept {
    stats_.deferred_now = deferred_.size();
    return stats_;
  }
  const replication_stats& replication() noexcept { return chain().stats(); }
  auto& sparse_table() noexcept { return updates_.sparse(); }
  auto& dense_table() noexcept { return updates_.dense(); }
  int shard() const noexcept { return transport_.rank(); }

 private:
  using clock = std::chrono::steady_clock;

  struct deferred {
    int from;
    request_header header;
    std::vector<key_type> keys;
  };

  // --- requests ---------------------------------------------------------------------------------

  void handle(int from, std::span<const std::byte> bytes) {
    request_view<T> r;
    try {
      r = decode_request<T>(bytes, from);
    } catch (const error& e) {
      dtrain::detail::log(dtrain::detail::log_level::warn, e.what());
      if (!roles_.is_server(from)) reply_error(from, response_header{}, errc::protocol_error, e.what());
      return;
    }
    if (roles_.is_server(from)) {
      on_server_message(from, r);
      return;
    }
    const request_header& h = r.header;
    response_header reply{h.what, 0, h.id, stats_.version, workers_.slowest(), 0, static_cast<std::uint32_t>(shard())};
    if (static_cast<int>(h.worker) != roles_.worker_of(from)) {
      reply_error(from, reply, errc::protocol_error,
                  "rank " + std::to_string(from) + " sent a request as worker " + std::to_string(h.worker));
      return;
    }
    const auto w = static_cast<std::size_t>(h.worker);
    workers_.heard_from(w);
    if (workers_.dead(w)) {
      reply_error(from, reply, errc::broken, "worker " + std::to_string(w) + " was dropped as dead; restart it");
      return;
    }
    if (!failure_.empty()) {
      reply_error(from, reply, errc::peer_lost, failure_);
      return;
    }
    try {
      // Each handler sends its own reply (or defers it until the consistency model allows).
      switch (h.what) {
        case op::hello: on_hello(from, r, reply); break;
        case op::push: on_push(from, r, reply); break;
        case op::pull: on_pull(from, r); break;
        case op::push_pull: on_push_pull(from, r); break;
        case op::clock: on_clock(from, h); break;
        case op::heartbeat: break;
        case op::checkpoint: on_checkpoint(from, reply); break;
        case op::goodbye: on_goodbye(from, w, reply); break;
        default: throw error(errc::protocol_error, std::string("a worker sent a ") + op_name(h.what) + ", which servers send");
      }
    } catch (const error& e) {
      reply_error(from, reply, code_of(e), e.what());
    }
  }

  void on_hello(int from, const request_view<T>& r, response_header reply) {
    const auto w = static_cast<std::size_t>(r.header.worker);
    job_configuration{roles_, Consistency::name, sizeof(T), options_.replicas}.check_hello(r.keys, r.header.worker, shard());
    workers_.greeted(w);
    key_cache_.forget(static_cast<std::uint32_t>(w));  // a restarted worker starts with an empty cache
    reply.slowest = workers_.clock_of(w);  // a resumed server tells the worker where it left off
    send(from, encode_response<T>(reply, {}));
  }

  void on_push(int from, request_view<T>& r, const response_header& reply) {
    push(r, keys_of(r));
    send(from, encode_response<T>(reply, {}));
  }

  // The worker finished a clock; its reply waits until the consistency model lets it advance.
  void on_clock(int from, const request_header& h) {
    workers_.advance(h.worker, h.clock);
    ++stats_.clocks;
    rounds_.close_contribution(h.worker);
    defer_or_serve({from, h, {}});
    progress();
  }

  void on_checkpoint(int from, const response_header& reply) {
    if (!checkpoints_.enabled()) throw error(errc::unsupported, "this server was started without a checkpoint path");
    save();
    send(from, encode_response<T>(reply, {}));
  }

  // An update to hold a copy of, an acknowledgement from a tail, or a head's goodbye.
  void on_server_message(int from, const request_view<T>& r) {
    auto apply = [this](table_id which, std::span<const key_type> keys, std::span<const T> values, std::size_t length,
                        std::uint64_t staleness) { updates_.apply_copy(which, keys, values, length, staleness); };
    try {
      chain().handle(transport_, from, r, [this] { return take_message(); }, apply, [this](int to, message m) { send_now(to, std::move(m)); });
    } catch (const error& e) {
      fail(code_of(e), e.what());
    }
  }

  void on_goodbye(int from, std::size_t w, const response_header& reply) {
    rounds_.close_contribution(static_cast<std::uint32_t>(w));
    workers_.finished(w);
    send(from, encode_response<T>(reply, {}));
    progress();
  }

  // Under ASP and SSP a push is applied as it arrives; under BSP and soft sync it waits for others.
  bool applies_on_arrival() const noexcept {
    return consistency_.staleness_bound() != 0 && consistency_.pushes_to_apply(workers_.live()) == 1;
  }

  key_list keys_of(const request_view<T>& r) { return key_cache_.keys_of(r.header, r.keys); }

  // The keys as a list the server keeps (a deferred pull, a push waiting for its round).
  static std::vector<key_type> own(request_view<T>& r, const key_list& k) {
    if (k.keys.data() == r.keys.data()) return std::move(r.keys);
    return {k.keys.begin(), k.keys.end()};
  }

  void check_push(const request_header& h, const key_list& k) {
    if (h.length == 0 && !k.keys.empty()) throw error(errc::invalid_argument, "push with keys of length 0");
    ++stats_.pushes;
    stats_.keys_pushed += k.keys.size();
  }

  void on_pull(int from, request_view<T>& r) {
    const key_list k = keys_of(r);
    const deferred d{from, r.header, {}};
    if (ready(d)) {
      serve(from, r.header, k);
    } else {
      defer(deferred{from, r.header, own(r, k)});
    }
  }

  // A push, then a pull of the same keys. When the push is applied on arrival and the pull may
  // be answered now, both happen in one pass over the keys; otherwise they go their separate
  // ways and the pull's answer is the reply.
  void on_push_pull(int from, request_view<T>& r) {
    const request_header& h = r.header;
    const key_list k = keys_of(r);
    if (!applies_on_arrival() || !ready(deferred{from, h, {}})) {
      std::vector<key_type> keys(k.keys.begin(), k.keys.end());
      push(r, k);
      defer_or_serve({from, h, std::move(keys)});
      return;
    }
    check_push(h, k);
    const std::size_t n = k.keys.size() * h.length;
    message m = response_with_room<T>({h.what, 0, h.id, stats_.version + 1, workers_.slowest(), 0, static_cast<std::uint32_t>(shard())}, n);
    updates_.apply_and_read(transport_, h.worker, h.table, k.keys, r.typed_values(), std::span<T>(m.values<T>(), n), h.length,
                            h.basis, k.resolved, take_frame());
    ++stats_.pulls;
    stats_.keys_pulled += k.keys.size();
    send(from, std::move(m));
  }

  void push(request_view<T>& r, const key_list& k) {
    const request_header& h = r.header;
    check_push(h, k);
    if (applies_on_arrival()) {  // straight from the request's bytes
      updates_.apply_single(transport_, h.worker, h.table, k.keys, r.typed_values(), h.length, h.basis, k.resolved, take_frame());
      return;
    }
    pending_push<T> p{h.worker, h.table, h.length, h.basis, own(r, k), {}};
    p.values.resize(r.values.size() / sizeof(T));
    if (!p.values.empty()) std::memcpy(p.values.data(), r.values.data(), r.values.size());
    if (consistency_.staleness_bound() == 0) {
      rounds_.hold_for_round(h.clock, std::move(p));  // applied when every worker finished the clock
      progress();
    } else {
      rounds_.hold_for_contribution(std::move(p));  // joins the soft-sync group when its clock ends
    }
  }

  // The request being handled, taken from the receive ring (which gets a spare buffer), so
  // that a copy down the chain sends its values from where they arrived.
  std::vector<std::byte> take_message() { return ring_->take_message(chain().spare()); }
  std::vector<std::byte>* take_frame() {
    if (!chain().replicating() || ring_ == nullptr) return nullptr;
    frame_ = take_message();
    return &frame_;
  }

  chain_replicator<Transport, T>& chain() noexcept { return updates_.replication(); }

  // Applies complete barrier rounds, flushes a final partial group, and answers what can be.
  void progress() {
    const std::int64_t s = workers_.slowest();
    auto apply = [this](std::vector<pending_push<T>>& group, std::size_t contributions) {
      updates_.apply_group(transport_, group, contributions);
    };
    rounds_.complete_rounds(s, apply);
    // At a round boundary every shard holds exactly the rounds before `s`: a consistent cut.
    if (consistency_.staleness_bound() == 0 && s != worker_clocks::done_clock && checkpoints_.due(s)) save();
    // A soft-sync group waits for s contributions; with fewer workers left, apply what there is.
    const int live = workers_.live();
    rounds_.complete_group(live == 0 ? 0 : static_cast<std::size_t>(std::max(consistency_.pushes_to_apply(live), 0)), apply);
    for (auto it = deferred_.begin(); it != deferred_.end();) {
      if (ready(*it)) {
        serve(*it);
        it = deferred_.erase(it);
      } else {
        ++it;
      }
    }
  }

  bool ready(const deferred& d) const {
    const std::int64_t s = workers_.slowest();
    if (d.header.what == op::clock) return consistency_.may_advance(workers_.clock_of(d.header.worker), s);
    return s >= consistency_.visible_clock(d.header.clock) + 1;  // a pull, or a push_pull's pull
  }

  void defer_or_serve(deferred d) {
    if (ready(d)) {
      serve(d);
    } else {
      defer(std::move(d));
    }
  }

  void defer(deferred d) {
    deferred_.push_back(std::move(d));
    stats_.max_deferred = std::max(stats_.max_deferred, deferred_.size());
  }

  void serve(const deferred& d) { serve(d.from, d.header, {d.keys, nullptr}); }

  // Answers a clock, or a pull (the pull of a push_pull too) with the values of `k`.
  void serve(int from, const request_header& h, const key_list& k) {
    response_header reply{h.what, 0, h.id, stats_.version, workers_.slowest(), 0, static_cast<std::uint32_t>(shard())};
    if (h.what == op::clock) {
      send(from, encode_response<T>(reply, {}));
      return;
    }
    try {
      if (h.length == 0 && !k.keys.empty()) throw error(errc::invalid_argument, "pull with length 0");
      const std::size_t n = k.keys.size() * h.length;
      message m = response_with_room<T>(reply, n);  // the table writes the values in place
      updates_.table_of(h.table).pull(k.keys, std::span<T>(m.values<T>(), n), h.length, k.resolved);
      ++stats_.pulls;
      stats_.keys_pulled += k.keys.size();
      send(from, std::move(m));
    } catch (const error& e) {
      reply_error(from, reply, code_of(e), e.what());
    }
  }

  // --- checkpoints -------------------------------------------------------------------------------

  void save() {
    const shard_state st{static_cast<std::uint32_t>(shard()), static_cast<std::uint32_t>(roles_.servers),
                         stats_.version, workers_.clocks()};
    checkpoints_.save(updates_.sparse(), updates_.dense(), st, std::min(workers_.slowest(), workers_.fastest()));
  }

  void restore() {
    const shard_state st = checkpoints_.restore(updates_.sparse(), updates_.dense(), options_.resume_clock, workers_.workers());
    stats_.version = st.version;
    workers_.restore(st.clocks);
  }

  // --- liveness ---------------------------------------------------------------------------------

  // A worker silent past its limit fails the server, or is dropped (policy `drop`).
  void check_liveness(clock::time_point start) {
    while (auto silent = workers_.overdue(start, options_.timeout, options_.heartbeat_timeout)) {
      const std::size_t w = silent->worker;
      const std::string me = "ps::server " + std::to_string(shard()) + ": ";
      const std::string who = "worker " + std::to_string(w) + " (rank " + std::to_string(roles_.worker_rank(static_cast<int>(w))) + ")";
      const std::string ms = std::to_string(silent->silent_for.count()) + " ms";
      if (silent->never_greeted) fail(errc::timeout, me + who + " never said hello within " + ms);
      if (options_.on_dead_worker == dead_worker_policy::abort) {
        fail(errc::peer_lost, me + who + " sent nothing for " + ms + " (heartbeat timeout); aborting");
      }
      workers_.drop(w);
      dtrain::detail::log(dtrain::detail::log_level::warn, me + "dropping " + who + ", silent for " + ms);
      progress();
    }
  }

  [[noreturn]] void fail(errc code, const std::string& why) {
    failure_ = why;
    auto refuse = [&](int to, op what, std::uint64_t id) {  // now: the chain will not release anything
      send_now(to, encode_error(response_header{what, 0, id, stats_.version, 0, 0, static_cast<std::uint32_t>(shard())}, code, why));
    };
    for (const auto& d : deferred_) refuse(d.from, d.header.what, d.header.id);
    deferred_.clear();
    chain().abandon_held(refuse);  // replies that waited for the tail
    flush_sends();
    throw error(code, why);
  }

  // --- replies ----------------------------------------------------------------------------------

  void reply_error(int to, response_header h, errc code, const std::string& text) {
    send(to, encode_error(h, code, text));
  }

  // A reply waits while an update this server applied is not yet at its chain's tail.
  void send(int to, message bytes) {
    if (chain().holding()) {
      chain().hold(to, std::move(bytes));
    } else {
      send_now(to, std::move(bytes));
    }
  }
  void send_now(int to, message bytes) { stats_.bytes_out += replies_.send(transport_, to, std::move(bytes)); }
  void reap_sends() {
    replies_.reap();
    chain().reap();
  }
  void flush_sends() noexcept {
    replies_.flush(deadline::after(options_.timeout));
    chain().flush(deadline::after(options_.timeout));
  }

  Transport transport_;
  roles roles_;
  Consistency consistency_;
  ps_options options_;
  shard_checkpoints checkpoints_;
  reply_queue<Transport> replies_;
  server_stats stats_;  // before updates_, which counts in it
  shard_updates<Transport, T, Updater, Initializer> updates_;
  worker_clocks workers_;
  push_rounds<T> rounds_;
  std::list<deferred> deferred_;
  kept_key_lists key_cache_;
  std::string failure_;
  dtrain::detail::receive_ring<Transport>* ring_ = nullptr;  // while `run` runs
  std::vector<std::byte> frame_;                             // a request taken from it
};

}  // namespace dtrain::ps
