#pragma once
/// @file
/// `ps::server`: one server of a parameter server. It holds the shards its chains give it (its
/// own, and with `ps_options::replicas` k > 1 copies of the k-1 before it: ps/chain.hpp), takes
/// every request on one receive ring, and hands each to the shard it names
/// (ps/shard_replica.hpp, which applies the consistency model). It watches its workers'
/// heartbeats and the other servers: when a server is lost (its connection breaks), the chains
/// close over it, and this server heads the shards whose heads before it are all lost, serving
/// what the workers send again.
///
/// A request that names a shard this server will head once it learns of a loss a worker already
/// saw (or an update from a server that already closed its chain over one) is kept back, in
/// order, until this server sees the loss too, or refused after the timeout.
///
/// A standby server (`roles::standby`) holds nothing at first. Standby i waits for the i-th
/// server lost (or one leaving that hands its place over) and then joins every chain that server
/// was in, as the tail, starting from the state the tail before it sends: the shards have k
/// copies again (ps/replacements.hpp decides who takes whose place). A growing standby joins the
/// shards it grows into when it comes, and their first copies give them up (ps/shard_moves.hpp);
/// ps/server_membership.hpp makes these changes. The other servers' messages are handled in
/// ps/server_messages.hpp; ps/server_watch.hpp tells which servers are lost.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <ranges>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/concepts/consistency.hpp"
#include "dtrain/concepts/transport.hpp"
#include "dtrain/concepts/updater.hpp"
#include "dtrain/core/deadline.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/detail/log.hpp"
#include "dtrain/detail/receive_ring.hpp"
#include "dtrain/ps/configuration.hpp"
#include "dtrain/ps/kept_requests.hpp"
#include "dtrain/ps/options.hpp"
#include "dtrain/ps/protocol.hpp"
#include "dtrain/ps/server_membership.hpp"
#include "dtrain/ps/server_messages.hpp"
#include "dtrain/ps/server_watch.hpp"
#include "dtrain/ps/roles.hpp"
#include "dtrain/ps/server_context.hpp"
#include "dtrain/ps/shard_replica.hpp"
#include "dtrain/ps/stats.hpp"
#include "dtrain/ps/table.hpp"
#include "dtrain/ps/worker_clocks.hpp"

namespace dtrain::ps {

/// One parameter server over `Transport`.
template <transport Transport, consistency Consistency, std::floating_point T, updater<T> Updater,
          initializer<T> Initializer = zero_initializer>
  requires std::copy_constructible<Updater>
class server : private server_messages<server<Transport, Consistency, T, Updater, Initializer>> {
  friend class server_messages<server>;

 public:
  using replica = shard_replica<Transport, Consistency, T, Updater, Initializer>;

  /// @param t this rank's endpoint; its rank must be a server rank of `r`
  server(Transport t, roles r, Consistency c, Updater u, Initializer init = {}, ps_options o = {},
         apply_mode mode = apply_mode::update)
      : ctx_(std::move(t), r, std::move(o)),
        liveness_(r.workers, r.late_workers),
        consistency_(c),
        updater_(u),
        init_(init),
        mode_(mode) {
    if (!r.is_server(me())) {
      throw error(errc::invalid_argument, "ps::server on rank " + std::to_string(me()) + ", which is a worker rank");
    }
    ctx_.stats.per_worker_staleness.assign(static_cast<std::size_t>(r.workers), std::vector<std::uint64_t>(33, 0));
    if (standby()) {  // the workers greeted the servers they started with, which checked them
      for (int w = 0; w < r.workers; ++w) liveness_.greeted(static_cast<std::size_t>(w));
    }
    for (int s : ctx_.layout.held_by(me())) {
      replica& held = shards_.try_emplace(s, ctx_, s, c, u, init, mode).first->second;
      held.start(ctx_.options.resume);
    }
  }
  server(const server&) = delete;
  server& operator=(const server&) = delete;

  /// Serves until every worker has said goodbye (or was dropped).
  /// @throws dtrain::error `timeout` naming the workers that never said hello; `peer_lost`
  ///   naming a worker that went silent (policy `abort`); the transport's errors.
  void run() {
    const auto start = clock::now();
    // Several receives stay posted, so the workers' pipelined requests (a sliced tensor's, or
    // many tensors') land in place instead of in the transport's unexpected queue.
    dtrain::detail::receive_ring<Transport> requests;
    requests.start(ctx_.transport, any_peer, ctx_.options.tag, ctx_.options.posted_requests);
    ctx_.ring = &requests;
    watch_.start();
    membership_.start();
    for (;;) {
      std::error_code ec;
      if (requests.wait_current(ctx_.options.spin, std::chrono::milliseconds(20), ec)) {
        handle_current(requests);
      } else if (ec != errc::timeout) {
        throw error(ec, "ps::server " + std::to_string(me()) + ": receiving requests");
      } else {
        let_go_of_departed_workers();  // nothing is waiting to be read
      }
      reap_sends();
      notice_losses(requests);
      membership_.move_shards();
      retry_kept();
      check_liveness(start);
      for (auto& [s, held] : shards_) {
        if (const std::string late = held.heading() ? held.chain().overdue() : std::string(); !late.empty())
          fail(errc::timeout, late);
      }
      if (leaving_.load() && !replacing().handing_over()) membership_.hand_over();
      if (finished()) {
        this->tell_standbys_done();
        break;
      }
      if (leaving_.load() && safe_to_leave()) break;
    }
    requests.cancel();
    ctx_.ring = nullptr;
    watch_.cancel();
    flush_sends();
  }

  /// Asks `run` to return early, leaving the job: once every update this server applied as a
  /// head is at its chain's tail (so every reply it held has gone out), it stops, and the
  /// others take its place as for a lost server (fail-over), once its transport is closed.
  /// With a standby to spare, the standby first joins every chain this server is in, so each
  /// shard keeps its k copies (the keys this server held move to it); this server stops once it
  /// has (or after `timeout`). Needs more than one copy of each shard, or a standby. Thread-safe
  /// (a signal handler's thread, say).
  void leave() noexcept { leaving_.store(true); }

  /// Whether this is a standby server (it holds copies only once it joined chains).
  bool standby() const noexcept { return ctx_.group.is_standby(me()); }

  /// What the server has done so far (its version: its own shard's). Not synchronised: read it
  /// from the thread that runs `run`, or after `run` returns.
  const server_stats& stats() noexcept {
    ctx_.stats.version = shards_.count(me()) != 0 ? own().updates().version() : 0;
    ctx_.stats.deferred_now = 0;
    for (auto& [s, held] : shards_) ctx_.stats.deferred_now += held.waiting().size();
    return ctx_.stats;
  }
  const replication_stats& replication() const noexcept { return ctx_.replication; }
  /// The tables of this server's own shard; `shard_tables(s)` those of any shard it holds
  /// (`held_shards()`). @throws dtrain::error `invalid_argument` for a shard it holds no copy of
  /// (a standby's own, until it takes a place)
  auto& sparse_table() { return own().updates().sparse(); }
  auto& dense_table() { return own().updates().dense(); }
  auto& shard_tables(int s) { return held(s).updates(); }
  std::vector<int> held_shards() const {
    const auto held = std::views::keys(shards_);
    return {held.begin(), held.end()};
  }
  /// Whether this server heads shard `s` (its own, or one it took over).
  bool heads(int s) const { return shards_.count(s) != 0 && shards_.at(s).heading(); }
  /// The updates applied to shard `s` (which this server holds).
  std::uint64_t version_of(int s) { return held(s).updates().version(); }
  int shard() const noexcept { return me(); }

 private:
  using clock = std::chrono::steady_clock;
  using value_type = T;
  using chain = shard_chain<Transport, T>;
  using fit = typename chain::fit;

  int me() const noexcept { return ctx_.me(); }
  replica& own() { return held(me()); }
  replica& held(int s) {
    const auto it = shards_.find(s);
    if (it != shards_.end()) return it->second;
    throw error(errc::invalid_argument,
                "ps::server " + std::to_string(me()) + " holds no copy of shard " + std::to_string(s) +
                    (standby() ? " (a standby holds copies only of the shards it joined)" : "") +
                    "; held_shards() lists those it holds");
  }
  replacements& replacing() noexcept { return membership_.replacing(); }

  // --- requests ---------------------------------------------------------------------------------

  // Handles the request the ring's current slot holds and posts the slot again.
  void handle_current(dtrain::detail::receive_ring<Transport>& requests) {
    ctx_.stats.bytes_in += requests.message().size();
    handle(requests.current().info().peer, std::span<const std::byte>(requests.message()));
    requests.advance();
  }

  void handle(int from, std::span<const std::byte> bytes) {
    request_view<T> r;
    try {
      r = decode_request<T>(bytes, from);
    } catch (const error& e) {
      dtrain::detail::log(dtrain::detail::log_level::warn, e.what());
      if (!ctx_.group.is_server(from))
        ctx_.send_now(from, encode_error(response_header{}, errc::protocol_error, e.what()));
      return;
    }
    // A state is never kept: what its sender sent before it is older, and waits for it.
    if (r.header.what != op::state && (kept_.holds_from(from) || waits_for_news(from, r.header))) {
      dtrain::detail::log(dtrain::detail::log_level::debug, "ps::server " + std::to_string(me()) + ": keeping a " +
                                                                op_name(r.header.what) + " of shard " +
                                                                std::to_string(r.header.shard) + " from rank " +
                                                                std::to_string(from) + " until it sees a loss");
      kept_.keep(from, ctx_.take_message({}));
      return;
    }
    dispatch(from, r);
  }

  void dispatch(int from, request_view<T>& r) {
    const request_header& h = r.header;
    if (ctx_.group.is_server(from)) return this->on_server_message(from, r);
    response_header reply = ctx_.answer_to(h.what, h.id, h.shard);
    auto refuse = [&](errc code, const std::string& why) { ctx_.send_now(from, encode_error(reply, code, why)); };
    if (static_cast<int>(h.worker) != ctx_.group.worker_of(from)) {
      return refuse(errc::protocol_error,
                    "rank " + std::to_string(from) + " sent a request as worker " + std::to_string(h.worker));
    }
    const auto w = static_cast<std::size_t>(h.worker);
    if (liveness_.absent(w)) liveness_.arrive(w, 0);  // a late worker's first message
    liveness_.heard_from(w);
    if (liveness_.dead(w))
      return refuse(errc::broken, "worker " + std::to_string(w) + " was dropped as dead; restart it");
    if (!failure_.empty()) return refuse(errc::peer_lost, failure_);
    if (h.what == op::heartbeat) {
      if ((h.flags & worker_done) == 0) return;
      liveness_.finished(w);
      for (auto& [s, held] : shards_) {
        if (held.heading()) held.worker_done(h.worker);
      }
      return;
    }
    if (h.what == op::hello) {
      try {
        job_configuration{ctx_.group, Consistency::name, sizeof(T), ctx_.options.replicas}.check_hello(r.keys, h.worker,
                                                                                                       me());
      } catch (const error& e) {
        return refuse(code_of(e), e.reason());
      }
      liveness_.greeted(w);
      for (auto& [s, held] : shards_) held.forget(h.worker);
      reply.slowest = own().workers().clock_of(w);  // a resumed server tells the worker where it left off
      ctx_.send_now(from, encode_response<T>(reply, {}));
      return;
    }
    const auto it = shards_.find(static_cast<int>(h.shard));
    if (it == shards_.end() && ctx_.layout.left(static_cast<int>(h.shard), me())) {
      return ctx_.send_now(from, moved_reply(ctx_.layout, ctx_.group, reply));
    }
    if (it == shards_.end() || !it->second.heading()) {
      const int head =
          h.shard < static_cast<std::uint32_t>(ctx_.layout.shards()) ? ctx_.layout.head(static_cast<int>(h.shard)) : -1;
      return refuse(errc::invalid_argument, "ps::server " + std::to_string(me()) + " does not head shard " +
                                                std::to_string(h.shard) +
                                                (head >= 0 ? " (server " + std::to_string(head) + " does)" : ""));
    }
    if (h.what == op::goodbye) liveness_.finished(w);
    it->second.handle(from, r);
  }

  // Whether a message must wait for news of a loss this server has not seen yet: a worker's
  // request for a shard this server holds but does not head, or a server's message that would
  // fit its chain once servers between are lost; or for the state of a shard it joins.
  bool waits_for_news(int from, const request_header& h) {
    if (replacing().joins(static_cast<int>(h.shard)) && ctx_.group.is_server(from)) return true;  // until its state
    const auto it = shards_.find(static_cast<int>(h.shard));
    if (it == shards_.end()) return false;
    if (ctx_.group.is_server(from)) return it->second.chain().fits(h.what, from) == fit::later;
    if (carries_shard(h.what) && membership_.moves_away(it->first))
      return true;  // answered `shard_moved` once it is gone
    return carries_shard(h.what) && !it->second.heading() && ctx_.layout.head(static_cast<int>(h.shard)) != me();
  }

  static bool carries_shard(op o) noexcept { return o != op::hello && o != op::heartbeat; }

  // Handles what was kept back once it no longer waits (or has waited past the timeout: it is
  // then refused), in order per sender.
  void retry_kept() {
    kept_.retry(ctx_.options.timeout, [&](int from, std::vector<std::byte>& bytes, bool overdue) {
      request_view<T> r = decode_request<T>(bytes, from);  // decoded once before: well formed
      if (!overdue && waits_for_news(from, r.header)) return false;
      ctx_.kept_message = &bytes;
      dispatch(from, r);
      ctx_.kept_message = nullptr;
      return true;
    });
  }

  // --- other servers ------------------------------------------------------------------------------

  // Closes the chains over every server found lost, taking over the shards this server now
  // heads. What a lost server sent before it was lost has arrived by the time its loss shows
  // (its connection's data comes before its end), so the requests that arrived are handled
  // first, in the chains as they were: a new head numbers on after the last update it got.
  void notice_losses(dtrain::detail::receive_ring<Transport>& requests) {
    const auto lost = watch_.lost();
    if (lost.empty()) return;
    for (std::error_code ec; requests.wait_current(std::chrono::microseconds(0), std::chrono::milliseconds(0), ec);) {
      handle_current(requests);
    }
    // After the workers have left, servers leaving are the end of the job, not news.
    const auto level = liveness_.live() > 0 ? dtrain::detail::log_level::warn : dtrain::detail::log_level::debug;
    for (const auto& [s, why] : lost) {
      membership_.lose(s);
      dtrain::detail::log(level, "ps::server " + std::to_string(me()) + ": server " + std::to_string(s) + " is lost (" +
                                     why + "); its chains close over it");
    }
    membership_.after_losses(level);
  }

  // Nothing this server answered is missing from any chain's tail, another copy of each shard
  // it heads is alive, and the standby it handed its place to joined its chains (`handed_over`).
  bool safe_to_leave() {
    for (auto& [s, held] : shards_) {
      if (held.heading() && (held.chain().holding() || ctx_.layout.chain(s).size() < 2)) return false;
      if (held.heading() && ctx_.layout.has_joined(s) && !held.workers_know_joined()) return false;
    }
    return replacing().handed_over(ctx_.layout, held_shards(), ctx_.options.timeout);
  }

  bool finished() {
    if (!kept_.empty() || liveness_.live() > 0 || replacing().joining()) return false;
    bool done = true;
    for (auto& [s, held] : shards_) done = held.finished() && done;
    return done;
  }

  // --- liveness ---------------------------------------------------------------------------------

  // A worker says goodbye to every shard's head at once. A shard this server took over after its
  // old head heard the goodbye and ended hears none: once the worker said goodbye here and has
  // been silent for the heartbeat timeout, nothing unread, no goodbye is coming; let it go.
  void let_go_of_departed_workers() {
    for (std::size_t w = 0; w < liveness_.workers(); ++w) {
      if (!liveness_.has_finished(w) || liveness_.silent_for(w) < ctx_.options.heartbeat_timeout) continue;
      for (auto& [s, held] : shards_) {
        const auto& ws = held.workers();
        if (!held.heading() || ws.has_finished(w) || ws.dead(w) || ws.absent(w)) continue;
        dtrain::detail::log(dtrain::detail::log_level::warn,
                            "ps::server " + std::to_string(me()) + ": shard " + std::to_string(s) + " lets worker " +
                                std::to_string(w) + " go: its goodbye went to the old head");
        held.worker_done(static_cast<std::uint32_t>(w));
      }
    }
  }

  // A worker silent past its limit fails the server, or is dropped (policy `drop`).
  void check_liveness(clock::time_point start) {
    while (auto silent = liveness_.overdue(start, ctx_.options.timeout, ctx_.options.heartbeat_timeout)) {
      const std::size_t w = silent->worker;
      const std::string lead = "ps::server " + std::to_string(me()) + ": ";
      const std::string who =
          "worker " + std::to_string(w) + " (rank " + std::to_string(ctx_.group.worker_rank(static_cast<int>(w))) + ")";
      const std::string ms = std::to_string(silent->silent_for.count()) + " ms";
      if (silent->never_greeted) fail(errc::timeout, lead + who + " never said hello within " + ms);
      if (ctx_.options.on_dead_worker == dead_worker_policy::abort) {
        fail(errc::peer_lost, lead + who + " sent nothing for " + ms + " (heartbeat timeout); aborting");
      }
      liveness_.drop(w);
      dtrain::detail::log(dtrain::detail::log_level::warn, lead + "dropping " + who + ", silent for " + ms);
      for (auto& [s, held] : shards_) {
        if (held.heading()) held.drop(w);
      }
    }
  }

  [[noreturn]] void fail(errc code, const std::string& why) {
    failure_ = why;
    auto refuse = [&](int to, op what, std::uint64_t id, int shard) {  // now: the chain will not release anything
      ctx_.send_now(to, encode_error(ctx_.answer_to(what, id, static_cast<std::uint32_t>(shard)), code, why));
    };
    for (auto& [s, held] : shards_) held.abandon(refuse);
    flush_sends();
    throw error(code, why);
  }

  // --- replies ----------------------------------------------------------------------------------

  void reap_sends() {
    ctx_.replies.reap();
    for (auto& [s, held] : shards_) held.chain().reap();
  }
  void flush_sends() noexcept {
    ctx_.replies.flush(deadline::after(ctx_.options.timeout));
    for (auto& [s, held] : shards_) held.chain().flush(deadline::after(ctx_.options.timeout));
  }

  server_context<Transport> ctx_;
  worker_clocks liveness_;  // hello, heartbeats and goodbyes, whatever shard they name
  std::map<int, replica> shards_;
  server_watch<Transport> watch_{ctx_};  // which other servers are lost
  kept_requests kept_;
  std::string failure_;
  std::atomic<bool> leaving_{false};
  // What a copy of a shard this server joins is made of.
  Consistency consistency_;
  Updater updater_;
  Initializer init_;
  apply_mode mode_;
  // Who holds which shard as the servers change; after shards_ and liveness_, which it works on.
  server_membership<Transport, T, replica> membership_{ctx_, shards_, liveness_};
};

}  // namespace dtrain::ps
