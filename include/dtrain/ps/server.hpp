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
#include <thread>
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
#include "dtrain/ps/key_cache.hpp"
#include "dtrain/ps/options.hpp"
#include "dtrain/ps/protocol.hpp"
#include "dtrain/ps/push_rounds.hpp"
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
        checkpoints_(o.checkpoint_prefix, transport_.rank(), r.servers),
        replies_(o.tag),
        sparse_(u, init, mode),
        dense_(u, init, mode),
        workers_(r.workers),
        key_cache_(r.workers) {
    if (!roles_.is_server(transport_.rank())) {
      throw error(errc::invalid_argument, "ps::server on rank " + std::to_string(transport_.rank()) +
                                              ", which is a worker rank");
    }
    stats_.per_worker_staleness.assign(static_cast<std::size_t>(r.workers), std::vector<std::uint64_t>(33, 0));
    if (options_.resume) restore();
    next_checkpoint_ =
        options_.checkpoint_every > 0 ? (workers_.slowest() / options_.checkpoint_every + 1) * options_.checkpoint_every : 0;
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
    for (;;) {
      auto& request = requests.current();
      std::error_code ec;
      // Requests come in bursts (a worker's push, clock and pull): look again for a few
      // microseconds before sleeping, which saves a wake-up per request in a burst.
      bool got = false;
      for (const auto spin_end = clock::now() + options_.spin; !got && clock::now() < spin_end;) {
        got = request.test();
        if (!got) std::this_thread::yield();
      }
      if (got) {
        request.wait(deadline::after(std::chrono::milliseconds(0)), ec);  // collects the status
        got = !ec;
      } else {
        got = request.wait(deadline::after(std::chrono::milliseconds(20)), ec);
      }
      if (got) {
        const int from = request.info().peer;
        stats_.bytes_in += requests.message().size();
        handle(from, std::span<const std::byte>(requests.message()));
        requests.advance();
      } else if (ec != errc::timeout) {
        throw error(ec, "ps::server " + std::to_string(transport_.rank()) + ": receiving requests");
      }
      reap_sends();
      check_liveness(start);
      if (workers_.live() == 0) break;
    }
    requests.cancel();
    flush_sends();
  }

  /// What the server has done so far. Not synchronised: read it from the thread that runs
  /// `run`, or after `run` returns.
  const server_stats& stats() noexcept {
    stats_.deferred_now = deferred_.size();
    return stats_;
  }
  auto& sparse_table() noexcept { return sparse_; }
  auto& dense_table() noexcept { return dense_; }
  int shard() const noexcept { return transport_.rank(); }

 private:
  using clock = std::chrono::steady_clock;
  using table_type = table<T, Updater, Initializer>;

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
    const request_header& h = r.header;
    response_header reply{h.what, 0, h.id, stats_.version, workers_.slowest(), 0, static_cast<std::uint32_t>(shard())};
    if (roles_.is_server(from) || static_cast<int>(h.worker) != roles_.worker_of(from)) {
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
      }
    } catch (const error& e) {
      reply_error(from, reply, code_of(e), e.what());
    }
  }

  void on_hello(int from, const request_view<T>& r, response_header reply) {
    const auto w = static_cast<std::size_t>(r.header.worker);
    check_hello(r);
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

  void on_goodbye(int from, std::size_t w, const response_header& reply) {
    rounds_.close_contribution(static_cast<std::uint32_t>(w));
    workers_.finished(w);
    send(from, encode_response<T>(reply, {}));
    progress();
  }

  void check_hello(const request_view<T>& r) {
    // keys: servers, workers, the consistency's name hash, value bytes
    const std::uint64_t want[4] = {static_cast<std::uint64_t>(roles_.servers), static_cast<std::uint64_t>(roles_.workers),
                                   name_digest(Consistency::name), sizeof(T)};
    if (r.keys.size() != 4 || !std::equal(r.keys.begin(), r.keys.end(), want)) {
      throw error(errc::invalid_argument,
                  "worker " + std::to_string(r.header.worker) + " was configured differently from server " +
                      std::to_string(shard()) + " (" + std::to_string(roles_.servers) + " servers, " +
                      std::to_string(roles_.workers) + " workers, " + std::string(Consistency::name) + ", " +
                      std::to_string(sizeof(T)) + "-byte values)");
    }
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
    const std::uint64_t s = staleness_of(h.basis);
    record_staleness(h.worker, s);
    const std::size_t n = k.keys.size() * h.length;
    message m = response_with_room<T>({h.what, 0, h.id, stats_.version + 1, workers_.slowest(), 0, static_cast<std::uint32_t>(shard())}, n);
    if (!k.keys.empty()) {
      table_of(h.table).push_pull(k.keys, r.typed_values(), std::span<T>(m.values<T>(), n), h.length, {s, 1.0}, k.resolved);
    }
    ++stats_.version;
    ++stats_.pulls;
    stats_.keys_pulled += k.keys.size();
    send(from, std::move(m));
  }

  void push(request_view<T>& r, const key_list& k) {
    const request_header& h = r.header;
    check_push(h, k);
    if (applies_on_arrival()) {  // straight from the request's bytes
      apply_single(h.worker, h.table, k.keys, r.typed_values(), h.length, h.basis, k.resolved);
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

  table_type& table_of(table_id which) noexcept { return which == table_id::sparse ? sparse_ : dense_; }

  // Versions applied since the worker read the parameters its push was computed from.
  std::uint64_t staleness_of(std::uint64_t basis) const noexcept { return stats_.version - std::min(basis, stats_.version); }

  void record_staleness(std::uint32_t worker, std::uint64_t s) {
    const std::size_t bucket = std::min<std::size_t>(s, 32);
    ++stats_.staleness_histogram[bucket];
    ++stats_.per_worker_staleness[worker][bucket];
  }

  // One push that is its own mean: straight into its table as one update.
  void apply_single(std::uint32_t worker, table_id which, std::span<const key_type> keys, std::span<const T> values,
                    std::size_t length, std::uint64_t basis, resolved_keys* resolved = nullptr) {
    const std::uint64_t s = staleness_of(basis);
    record_staleness(worker, s);
    if (!keys.empty()) table_of(which).push(keys, values, length, {s, 1.0}, resolved);
    ++stats_.version;
  }

  // Applies a group of pushes as one update, the mean over its `contributions` (a worker's
  // clock may span several requests, slices or servers' shares: it counts once).
  void apply_group(std::vector<pending_push<T>>& group, std::size_t contributions) {
    if (group.empty()) return;
    if (group.size() == 1 && contributions == 1) {
      const pending_push<T>& p = group.front();
      apply_single(p.worker, p.which, p.keys, p.values, p.length, p.basis);
      return;
    }
    double staleness = 0;
    for (const auto& p : group) {
      const std::uint64_t s = staleness_of(p.basis);
      staleness += static_cast<double>(s);
      record_staleness(p.worker, s);
    }
    const step_info info{static_cast<std::uint64_t>(staleness / static_cast<double>(group.size()) + 0.5), 1.0};
    // Gradients are averaged over the group; summation mode adds every push as it is.
    const T scale = sparse_.mode() == apply_mode::sum ? T(1) : T(1) / static_cast<T>(contributions);
    for (const group_mean<T>& m : mean_of(group, scale)) table_of(m.which).push(m.keys, m.values, m.length, info);
    ++stats_.version;
  }

  // Applies complete barrier rounds, flushes a final partial group, and answers what can be.
  void progress() {
    const std::int64_t s = workers_.slowest();
    auto apply = [this](std::vector<pending_push<T>>& group, std::size_t contributions) {
      apply_group(group, contributions);
    };
    rounds_.complete_rounds(s, apply);
    // At a round boundary every shard holds exactly the rounds before `s`: a consistent cut.
    if (consistency_.staleness_bound() == 0 && next_checkpoint_ > 0 && s != worker_clocks::done_clock &&
        s >= next_checkpoint_) {
      save();
      next_checkpoint_ = (s / options_.checkpoint_every + 1) * options_.checkpoint_every;
    }
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
      table_of(h.table).pull(k.keys, std::span<T>(m.values<T>(), n), h.length, k.resolved);
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
    checkpoints_.save(sparse_, dense_, st, std::min(workers_.slowest(), workers_.fastest()));
  }

  void restore() {
    const shard_state st = checkpoints_.restore(sparse_, dense_, options_.resume_clock, workers_.workers());
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
    for (const auto& d : deferred_) {
      reply_error(d.from, response_header{d.header.what, 0, d.header.id, stats_.version, 0, 0,
                                          static_cast<std::uint32_t>(shard())},
                  code, why);
    }
    deferred_.clear();
    flush_sends();
    throw error(code, why);
  }

  // --- replies ----------------------------------------------------------------------------------

  void reply_error(int to, response_header h, errc code, const std::string& text) {
    send(to, encode_error(h, code, text));
  }

  void send(int to, message bytes) { stats_.bytes_out += replies_.send(transport_, to, std::move(bytes)); }
  void reap_sends() { replies_.reap(); }
  void flush_sends() noexcept { replies_.flush(deadline::after(options_.timeout)); }

  Transport transport_;
  roles roles_;
  Consistency consistency_;
  ps_options options_;
  shard_checkpoints checkpoints_;
  reply_queue<Transport> replies_;
  table_type sparse_, dense_;
  worker_clocks workers_;
  push_rounds<T> rounds_;
  std::list<deferred> deferred_;
  kept_key_lists key_cache_;
  std::string failure_;
  std::int64_t next_checkpoint_ = 0;
  server_stats stats_;
};

}  // namespace dtrain::ps
