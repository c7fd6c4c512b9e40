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
#include <cstdio>
#include <deque>
#include <limits>
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
#include "dtrain/ps/reply_queue.hpp"
#include "dtrain/ps/roles.hpp"
#include "dtrain/ps/shard_checkpoints.hpp"
#include "dtrain/ps/table.hpp"

namespace dtrain::ps {

/// What a server has done, for logs and the observability of issue 6.
struct server_stats {
  std::uint64_t version = 0;        ///< updates applied
  std::uint64_t pushes = 0, pulls = 0, clocks = 0;
  std::uint64_t keys_pushed = 0, keys_pulled = 0;
  std::uint64_t bytes_in = 0, bytes_out = 0;
  std::size_t max_deferred = 0;     ///< the longest queue of pulls and clocks waiting for others
  std::vector<std::uint64_t> staleness_histogram = std::vector<std::uint64_t>(33, 0);  ///< [32] counts >= 32
  /// The same, per worker: `per_worker_staleness[w][s]`.
  std::vector<std::vector<std::uint64_t>> per_worker_staleness;
  std::size_t deferred_now = 0;     ///< pulls and clocks waiting at the moment of the snapshot
  /// The histogram's mean.
  double mean_staleness() const noexcept {
    double n = 0, sum = 0;
    for (std::size_t s = 0; s < staleness_histogram.size(); ++s) {
      n += static_cast<double>(staleness_histogram[s]);
      sum += static_cast<double>(s * staleness_histogram[s]);
    }
    return n > 0 ? sum / n : 0;
  }
};

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
        clocks_(static_cast<std::size_t>(r.workers), 0),
        finished_(static_cast<std::size_t>(r.workers), false),
        dead_(static_cast<std::size_t>(r.workers), false),
        greeted_(static_cast<std::size_t>(r.workers), false),
        last_seen_(static_cast<std::size_t>(r.workers), std::chrono::steady_clock::now()),
        key_cache_(r.workers) {
    if (!roles_.is_server(transport_.rank())) {
      throw error(errc::invalid_argument, "ps::server on rank " + std::to_string(transport_.rank()) +
                                              ", which is a worker rank");
    }
    stats_.per_worker_staleness.assign(static_cast<std::size_t>(r.workers), std::vector<std::uint64_t>(33, 0));
    if (options_.resume) restore();
    next_checkpoint_ = options_.checkpoint_every > 0 ? (slowest() / options_.checkpoint_every + 1) * options_.checkpoint_every : 0;
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
      if (done()) break;
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

  struct pending_push {
    std::uint32_t worker;
    table_id which;
    std::uint32_t length;
    std::uint64_t basis;
    std::vector<key_type> keys;
    std::vector<T> values;
  };

  struct deferred {
    int from;
    request_header header;
    std::vector<key_type> keys;
  };

  static constexpr std::int64_t done_clock = std::numeric_limits<std::int64_t>::max();

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
    response_header reply{h.what, 0, h.id, stats_.version, slowest(), 0, static_cast<std::uint32_t>(shard())};
    if (roles_.is_server(from) || static_cast<int>(h.worker) != roles_.worker_of(from)) {
      reply_error(from, reply, errc::protocol_error,
                  "rank " + std::to_string(from) + " sent a request as worker " + std::to_string(h.worker));
      return;
    }
    const auto w = static_cast<std::size_t>(h.worker);
    last_seen_[w] = clock::now();
    if (dead_[w]) {
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
    greeted_[w] = true;
    key_cache_.forget(static_cast<std::uint32_t>(w));  // a restarted worker starts with an empty cache
    reply.slowest = clocks_[w];  // a resumed server tells the worker where it left off
    send(from, encode_response<T>(reply, {}));
  }

  void on_push(int from, request_view<T>& r, const response_header& reply) {
    push(r, keys_of(r));
    send(from, encode_response<T>(reply, {}));
  }

  // The worker finished a clock; its reply waits until the consistency model lets it advance.
  void on_clock(int from, const request_header& h) {
    const auto w = static_cast<std::size_t>(h.worker);
    if (h.clock != clocks_[w]) {
      throw error(errc::protocol_error, "worker " + std::to_string(w) + " finished clock " + std::to_string(h.clock) +
                                            " but the server expected " + std::to_string(clocks_[w]));
    }
    ++clocks_[w];
    ++stats_.clocks;
    close_bundle(w);
    defer_or_serve({from, h, {}});
    progress();
  }

  void on_checkpoint(int from, const response_header& reply) {
    if (!checkpoints_.enabled()) throw error(errc::unsupported, "this server was started without a checkpoint path");
    save();
    send(from, encode_response<T>(reply, {}));
  }

  void on_goodbye(int from, std::size_t w, const response_header& reply) {
    close_bundle(w);
    finished_[w] = true;
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
    return consistency_.staleness_bound() != 0 && consistency_.pushes_to_apply(live_workers()) == 1;
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

  // The request's values, read in place. They are the representation of T values the transport
  // copied in; the header and keys keep them aligned (the buffer comes from operator new).
  static std::span<const T> values_of(const request_view<T>& r) noexcept {
    return {reinterpret_cast<const T*>(r.values.data()), r.values.size() / sizeof(T)};
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
    message m = response_with_room<T>({h.what, 0, h.id, stats_.version + 1, slowest(), 0, static_cast<std::uint32_t>(shard())}, n);
    if (!k.keys.empty()) {
      table_of(h.table).push_pull(k.keys, values_of(r), std::span<T>(m.values<T>(), n), h.length, {s, 1.0}, k.resolved);
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
      apply_single(h.worker, h.table, k.keys, values_of(r), h.length, h.basis, k.resolved);
      return;
    }
    pending_push p{h.worker, h.table, h.length, h.basis, own(r, k), {}};
    p.values.resize(r.values.size() / sizeof(T));
    if (!p.values.empty()) std::memcpy(p.values.data(), r.values.data(), r.values.size());
    if (consistency_.staleness_bound() == 0) {
      by_clock_[h.clock].push_back(std::move(p));  // applied when every worker finished the clock
      progress();
    } else {
      open_bundle_[p.worker].push_back(std::move(p));  // joins the soft-sync group when its clock ends
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

  // Applies the group's pushes, in worker order (deterministic under BSP): each key's pushes are
  // summed and divided by `bundles`, the number of (worker, clock) contributions in the group,
  // so a worker whose clock spans several requests (slices, servers' shares) counts once.
  void apply_group(std::vector<pending_push>& group, std::size_t bundles) {
    if (group.empty()) return;
    if (group.size() == 1 && bundles == 1) {
      const pending_push& p = group.front();
      apply_single(p.worker, p.which, p.keys, p.values, p.length, p.basis);
      group.clear();
      return;
    }
    std::stable_sort(group.begin(), group.end(), [](const auto& a, const auto& b) { return a.worker < b.worker; });
    double staleness = 0;
    for (const auto& p : group) {
      const std::uint64_t s = staleness_of(p.basis);
      staleness += static_cast<double>(s);
      record_staleness(p.worker, s);
    }
    const step_info info{static_cast<std::uint64_t>(staleness / static_cast<double>(group.size()) + 0.5), 1.0};
    // Gradients are averaged over the group; summation mode adds every push as it is.
    const T scale = sparse_.mode() == apply_mode::sum ? T(1) : T(1) / static_cast<T>(bundles);
    for (table_id which : {table_id::sparse, table_id::dense}) {
      // Sum each key's pushes in worker order, then scale: the mean gradient of the group.
      std::map<key_type, std::vector<T>> sums;
      for (const auto& p : group) {
        if (p.which != which) continue;
        for (std::size_t i = 0; i < p.keys.size(); ++i) {
          auto& acc = sums[p.keys[i]];
          if (acc.empty()) acc.assign(p.length, T(0));
          if (acc.size() != p.length) {
            throw error(errc::invalid_argument, "key " + std::to_string(p.keys[i]) + " pushed with lengths " +
                                                    std::to_string(acc.size()) + " and " + std::to_string(p.length));
          }
          for (std::size_t j = 0; j < p.length; ++j) acc[j] += p.values[i * p.length + j];
        }
      }
      table_type& t = which == table_id::sparse ? sparse_ : dense_;
      // Keys of one length go in one table push.
      std::map<std::size_t, std::pair<std::vector<key_type>, std::vector<T>>> by_length;
      for (auto& [key, acc] : sums) {
        auto& [keys, values] = by_length[acc.size()];
        keys.push_back(key);
        for (T v : acc) values.push_back(v * scale);
      }
      for (auto& [length, kv] : by_length) t.push(kv.first, kv.second, length, info);
    }
    ++stats_.version;
    group.clear();
  }

  // Applies complete barrier rounds, flushes a final partial group, and answers what can be.
  void progress() {
    const std::int64_t s = slowest();
    while (!by_clock_.empty() && by_clock_.begin()->first < s) {
      auto& round = by_clock_.begin()->second;
      std::vector<bool> seen(clocks_.size(), false);
      std::size_t workers = 0;
      for (const auto& p : round) workers += !seen[p.worker] ? (seen[p.worker] = true, 1) : 0;
      apply_group(round, workers);
      by_clock_.erase(by_clock_.begin());
    }
    // At a round boundary every shard holds exactly the rounds before `s`: a consistent cut.
    if (consistency_.staleness_bound() == 0 && next_checkpoint_ > 0 && s != done_clock && s >= next_checkpoint_) {
      save();
      next_checkpoint_ = (s / options_.checkpoint_every + 1) * options_.checkpoint_every;
    }
    // A soft-sync group waits for s contributions; with fewer workers left, apply what there is.
    if (bundles_ > 0 && (live_workers() == 0 || static_cast<int>(bundles_) >= consistency_.pushes_to_apply(live_workers()))) {
      apply_group(group_, bundles_);
      bundles_ = 0;
    }
    for (auto it = deferred_.begin(); it != deferred_.end();) {
      if (ready(*it)) {
        serve(*it);
        it = deferred_.erase(it);
      } else {
        ++it;
      }
    }
  }

  // A worker's pushes of one clock join the soft-sync group as one contribution.
  void close_bundle(std::size_t w) {
    auto it = open_bundle_.find(static_cast<std::uint32_t>(w));
    if (it == open_bundle_.end() || it->second.empty()) return;
    for (auto& p : it->second) group_.push_back(std::move(p));
    it->second.clear();
    ++bundles_;
  }

  bool ready(const deferred& d) const {
    const std::int64_t s = slowest();
    if (d.header.what == op::clock) return consistency_.may_advance(clocks_[d.header.worker], s);
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
    response_header reply{h.what, 0, h.id, stats_.version, slowest(), 0, static_cast<std::uint32_t>(shard())};
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
                         stats_.version, clocks_};
    checkpoints_.save(sparse_, dense_, st, std::min(slowest(), *std::max_element(clocks_.begin(), clocks_.end())));
  }

  void restore() {
    const shard_state st = checkpoints_.restore(sparse_, dense_, options_.resume_clock, clocks_.size());
    stats_.version = st.version;
    clocks_ = st.clocks;
  }

  // --- workers' state ---------------------------------------------------------------------------

  int live_workers() const noexcept {
    int n = 0;
    for (std::size_t w = 0; w < finished_.size(); ++w) n += !finished_[w] && !dead_[w];
    return n;
  }

  std::int64_t slowest() const noexcept {
    std::int64_t s = done_clock;
    for (std::size_t w = 0; w < clocks_.size(); ++w) {
      if (!finished_[w] && !dead_[w]) s = std::min(s, clocks_[w]);
    }
    return s;
  }

  bool done() const noexcept { return live_workers() == 0; }

  void check_liveness(clock::time_point start) {
    const auto now = clock::now();
    for (std::size_t w = 0; w < last_seen_.size(); ++w) {
      if (finished_[w] || dead_[w]) continue;
      const bool never = !greeted_[w];
      const auto limit = never ? options_.timeout : options_.heartbeat_timeout;
      const auto since = now - (never ? start : last_seen_[w]);
      if (since <= limit) continue;
      const std::string who = "worker " + std::to_string(w) + " (rank " + std::to_string(roles_.worker_rank(static_cast<int>(w))) + ")";
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(since).count();
      if (never) {
        fail(errc::timeout, "ps::server " + std::to_string(shard()) + ": " + who + " never said hello within " +
                                std::to_string(ms) + " ms");
      }
      if (options_.on_dead_worker == dead_worker_policy::abort) {
        fail(errc::peer_lost, "ps::server " + std::to_string(shard()) + ": " + who + " sent nothing for " +
                                  std::to_string(ms) + " ms (heartbeat timeout); aborting");
      }
      dead_[w] = true;
      dtrain::detail::log(dtrain::detail::log_level::warn,
                          "ps::server " + std::to_string(shard()) + ": dropping " + who + ", silent for " +
                              std::to_string(ms) + " ms");
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
  std::vector<std::int64_t> clocks_;
  std::vector<bool> finished_, dead_, greeted_;
  std::vector<clock::time_point> last_seen_;
  std::map<std::int64_t, std::vector<pending_push>> by_clock_;
  std::vector<pending_push> group_;  // soft sync: the contributions so far
  std::size_t bundles_ = 0;
  std::map<std::uint32_t, std::vector<pending_push>> open_bundle_;  // soft sync: this clock's pushes
  std::list<deferred> deferred_;
  kept_key_lists key_cache_;
  std::string failure_;
  std::int64_t next_checkpoint_ = 0;
  server_stats stats_;
};

}  // namespace dtrain::ps
