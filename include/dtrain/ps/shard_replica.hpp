#pragma once
/// @file
/// `ps::shard_replica`: one shard as one server holds it. Every copy has the shard's tables and
/// its place in the shard's chain; the head's copy also serves the workers: it applies pushes as
/// its consistency model says, answers pulls once the model allows, holds back workers that run
/// too far ahead, and measures the staleness of every update.
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
///  - Staleness of a push: the shard's version (updates applied) when it is applied, minus the
///    version the worker last pulled. Averaged pushes carry their mean staleness.
///
/// A copy becomes the head when the heads before it in the chain are lost (`take_over`; it and the
/// other changes of membership are in ps/replica_membership.hpp). It then serves the requests the
/// workers send again: a push it already holds (by the worker's request id under ASP and SSP, by
/// the round under a barrier model) is acknowledged, not applied twice.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <list>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/concepts/consistency.hpp"
#include "dtrain/concepts/transport.hpp"
#include "dtrain/concepts/updater.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/ps/checkpoint.hpp"
#include "dtrain/ps/key_cache.hpp"
#include "dtrain/ps/protocol.hpp"
#include "dtrain/ps/push_rounds.hpp"
#include "dtrain/ps/replica_membership.hpp"
#include "dtrain/ps/replication.hpp"
#include "dtrain/ps/server_context.hpp"
#include "dtrain/ps/shard_checkpoints.hpp"
#include "dtrain/ps/shard_transfer.hpp"
#include "dtrain/ps/shard_updates.hpp"
#include "dtrain/ps/table.hpp"
#include "dtrain/ps/worker_clocks.hpp"

namespace dtrain::ps {

template <transport Transport, consistency Consistency, std::floating_point T, updater<T> Updater, class Initializer>
class shard_replica
    : public replica_membership<shard_replica<Transport, Consistency, T, Updater, Initializer>> {
  friend class replica_membership<shard_replica>;
  using replica_membership<shard_replica>::send_state;

 public:
  /// A request whose reply waits for the consistency model.
  struct deferred {
    int from;
    request_header header;
    std::vector<key_type> keys;
  };

  shard_replica(server_context<Transport>& ctx, int shard, Consistency c, Updater u, Initializer init, apply_mode mode)
      : ctx_(&ctx),
        shard_(shard),
        consistency_(c),
        updates_(std::move(u), std::move(init), mode,
                 shard_chain<Transport, T>(ctx.layout, shard, ctx.me(), ctx.options.tag, ctx.options.timeout,
                                           ctx.replication),
                 ctx.stats),
        heading_(ctx.layout.head(shard) == ctx.me()),
        workers_(ctx.group.workers, ctx.group.late_workers),
        key_cache_(ctx.group.workers),
        checkpoints_(ctx.options.checkpoint_prefix, shard, ctx.group.shard_count(), ctx.options.checkpoint_every) {}

  int shard() const noexcept { return shard_; }
  bool heading() const noexcept { return heading_; }
  auto& updates() noexcept { return updates_; }
  shard_chain<Transport, T>& chain() noexcept { return updates_.replication(); }
  worker_clocks& workers() noexcept { return workers_; }
  const std::list<deferred>& waiting() const noexcept { return deferred_; }

  /// Restores the shard from its checkpoints and starts the checkpoint schedule.
  void start(bool resume) {
    if (resume) {
      const shard_state st =
          checkpoints_.restore(updates_.sparse(), updates_.dense(), ctx_->options.resume_clock, workers_.workers());
      updates_.set_version(st.version);
      workers_.restore(st.clocks);
    }
    checkpoints_.start_after(workers_.slowest());
  }

  // --- requests ---------------------------------------------------------------------------------

  /// Serves worker request `r` from rank `from` (this copy heads the shard).
  void handle(int from, request_view<T>& r) {
    const request_header& h = r.header;
    try {
      switch (h.what) {  // each handler sends its own reply, or defers it
        case op::push: on_push(from, r); break;
        case op::pull: on_pull(from, r); break;
        case op::push_pull: on_push_pull(from, r); break;
        case op::clock: on_clock(from, h); break;
        case op::checkpoint: on_checkpoint(from, h); break;
        case op::goodbye: on_goodbye(from, h); break;
        case op::enter: on_enter(from, h); break;
        default:
          throw error(errc::protocol_error,
                      std::string("a worker sent a ") + op_name(h.what) + " to shard " + std::to_string(shard_));
      }
    } catch (const error& e) {
      send(from, encode_error(reply_to(h), code_of(e), e.reason()));
    }
  }

  /// A worker said hello: its key lists are forgotten (a restarted worker starts afresh).
  void forget(std::uint32_t w) { key_cache_.forget(w); }

  /// An update from the shard's head (or the copy before this one), an acknowledgement from the
  /// tail, or the head's goodbye: it fits the chain (`shard_chain::fits`).
  void on_server_message(int from, const request_view<T>& r) {
    auto apply = [this](table_id which, std::span<const key_type> keys, std::span<const T> values, std::size_t length,
                        std::uint64_t staleness,
                        bool last) { updates_.apply_copy(which, keys, values, length, staleness, last); };
    chain().handle(ctx_->transport, from, r, [this] { return take_message(); }, apply,
                   [this](int to, message m) { ctx_->send_now(to, std::move(m)); }, [this](int to) { send_state(to); });
  }

  /// Worker `w` was dropped as dead: it no longer holds anyone back.
  void drop(std::size_t w) {
    workers_.drop(w);
    progress();
  }

  /// Whether every live worker has had a reply naming the servers that joined the chain, so
  /// that it finds them once the copies before them are gone (a server leaving waits for it).
  bool workers_know_joined() const {
    for (std::size_t w = 0; w < told_.size(); ++w) {
      if (workers_.is_live(w) && !told_[w]) return false;
    }
    return true;
  }

  /// Whether this copy is done: as the head, every worker left and the chain holds everything.
  bool finished() {
    return chain().finished(ctx_->transport, heading_ && workers_.live() == 0) && (!heading_ || workers_.live() == 0);
  }

  /// Refuses every reply waiting here (the server is failing), calling `refuse(to, op, id)`.
  template <class Refuse>
  void abandon(Refuse&& refuse) {
    for (const auto& d : deferred_) refuse(d.from, d.header.what, d.header.id, shard_);
    deferred_.clear();
    chain().abandon_held([&](int to, op what, std::uint64_t id) { refuse(to, what, id, shard_); });
  }

 private:
  // The reply's header; it names the live servers that joined the chain, and notes the worker
  // as one that knows them.
  response_header reply_to(const request_header& h) {
    response_header r{
        h.what, 0, h.id, updates_.version(), workers_.slowest(), 0, static_cast<std::uint32_t>(ctx_->me())};
    r.shard = static_cast<std::uint32_t>(shard_);
    std::size_t n = 0;
    for (int s : ctx_->layout.joined(shard_)) {
      if (n < r.joined.size() && !ctx_->layout.gone(shard_, s)) r.joined[n++] = static_cast<std::uint32_t>(s) + 1;
    }
    if (n > 0 && h.worker < told_.size()) told_[h.worker] = true;
    return r;
  }

  // A push this copy holds already: sent again by a worker after the head that had it was lost.
  bool already_holds(const request_header& h) {
    if ((h.flags & resent) == 0 || h.what == op::pull) return false;
    if (applies_on_arrival()) return h.id <= chain().last_push_of(h.worker);
    return h.clock < chain().rounds_applied() || rounds_.holds(h.worker, h.id);
  }

  void on_push(int from, request_view<T>& r) {
    if (!already_holds(r.header)) push(r, keys_of(r));
    send(from, encode_response<T>(reply_to(r.header), {}));
  }

  // The worker finished a clock; its reply waits until the consistency model lets it advance.
  // A clock it sends again (it had sent it to a head that was lost) is answered as it stands.
  void on_clock(int from, const request_header& h) {
    if (taken_over_ && h.clock < workers_.clock_of(h.worker)) {
      defer_or_serve({from, h, {}});
      return;
    }
    if (taken_over_ && h.clock > workers_.clock_of(h.worker)) workers_.set_clock(h.worker, h.clock);
    workers_.advance(h.worker, h.clock);
    ++ctx_->stats.clocks;
    rounds_.close_contribution(h.worker);
    // Answered by `progress`, after the round this clock completes is applied (and, with
    // replication, held until the tail has it): never from state the chain does not hold yet.
    defer({from, h, {}});
    progress();
  }

  void on_checkpoint(int from, const request_header& h) {
    if (!checkpoints_.enabled()) throw error(errc::unsupported, "this server was started without a checkpoint path");
    save();
    send(from, encode_response<T>(reply_to(h), {}));
  }

  // A late worker joins the running job, in two steps so that every shard starts it at the same
  // clock: asked (clock 0), each shard holds a clock past its rounds in progress for it
  // (`entry_clock`), which keeps it from completing any round from that one on; the worker then
  // enters at the latest clock a shard named. Rounds before it complete without the worker.
  void on_enter(int from, const request_header& h) {
    const std::size_t w = h.worker;
    if (h.clock == 0) {
      if (workers_.absent(w)) workers_.arrive(w, workers_.entry_clock());
    } else if (h.clock > workers_.clock_of(w)) {
      workers_.set_clock(w, h.clock);
      progress();
    }
    response_header reply = reply_to(h);
    reply.slowest = workers_.clock_of(w);
    send(from, encode_response<T>(reply, {}));
  }

  void on_goodbye(int from, const request_header& h) {
    let_go(h.worker);
    send(from, encode_response<T>(reply_to(h), {}));
    progress();
  }

 public:
  /// Worker `w` said goodbye to every shard (what a standby heading this shard now hears in
  /// its last heartbeat): it no longer holds anyone back.
  void worker_done(std::uint32_t w) {
    let_go(w);
    progress();
  }

 private:
  void let_go(std::uint32_t w) {
    rounds_.close_contribution(w);
    workers_.finished(w);
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
    ++ctx_->stats.pushes;
    ctx_->stats.keys_pushed += k.keys.size();
  }

  void on_pull(int from, request_view<T>& r) {
    const key_list k = keys_of(r);
    if (ready(deferred{from, r.header, {}})) {
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
    const bool held = already_holds(h);
    if (held || !applies_on_arrival() || !ready(deferred{from, h, {}})) {
      std::vector<key_type> keys(k.keys.begin(), k.keys.end());
      if (!held) push(r, k);
      defer_or_serve({from, h, std::move(keys)});
      return;
    }
    check_push(h, k);
    const std::size_t n = k.keys.size() * h.length;
    response_header reply = reply_to(h);
    reply.version = updates_.version() + 1;
    message m = response_with_room<T>(reply, n);
    updates_.apply_and_read(ctx_->transport, {h.worker, h.id}, h.table, k.keys, r.typed_values(),
                            std::span<T>(m.values<T>(), n), h.length, h.basis, k.resolved, take_frame());
    ++ctx_->stats.pulls;
    ctx_->stats.keys_pulled += k.keys.size();
    send(from, std::move(m));
  }

  void push(request_view<T>& r, const key_list& k) {
    const request_header& h = r.header;
    check_push(h, k);
    if (applies_on_arrival()) {  // straight from the request's bytes
      updates_.apply_single(ctx_->transport, {h.worker, h.id}, h.worker, h.table, k.keys, r.typed_values(), h.length,
                            h.basis, k.resolved, take_frame());
      return;
    }
    pending_push<T> p{h.worker, h.id, h.table, h.length, h.basis, own(r, k), {}};
    p.values.resize(r.values.size() / sizeof(T));
    if (!p.values.empty()) std::memcpy(p.values.data(), r.values.data(), r.values.size());
    if (consistency_.staleness_bound() == 0) {
      rounds_.hold_for_round(h.clock, std::move(p));  // applied when every worker finished the clock
      progress();
    } else {
      rounds_.hold_for_contribution(std::move(p));  // joins the soft-sync group when its clock ends
    }
  }

  // The request being handled, taken from where it arrived (which gets a spare buffer), so
  // that a copy down the chain sends its values from where they arrived.
  std::vector<std::byte> take_message() { return ctx_->take_message(chain().spare()); }
  std::vector<std::byte>* take_frame() {
    if (!chain().replicating()) return nullptr;
    frame_ = take_message();
    return frame_.empty() ? nullptr : &frame_;
  }

 public:
  /// Applies complete barrier rounds, flushes a final partial group, and answers what can be.
  void progress() {
    if (!heading_) return;
    const std::int64_t s = workers_.slowest();
    auto apply = [this](std::vector<pending_push<T>>& group, std::size_t contributions, std::int64_t round) {
      updates_.apply_group(ctx_->transport, group, contributions, round);
    };
    rounds_.complete_rounds(s, apply);
    // At a round boundary every shard holds exactly the rounds before `s`: a consistent cut.
    if (consistency_.staleness_bound() == 0 && s != worker_clocks::done_clock && checkpoints_.due(s)) save();
    // A soft-sync group waits for s contributions; with fewer workers left, apply what there is.
    const int live = workers_.live();
    rounds_.complete_group(live == 0 ? 0 : static_cast<std::size_t>(std::max(consistency_.pushes_to_apply(live), 0)),
                           apply);
    for (auto it = deferred_.begin(); it != deferred_.end();) {
      if (ready(*it)) {
        serve(*it);
        it = deferred_.erase(it);
      } else {
        ++it;
      }
    }
  }

 private:
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
    ctx_->stats.max_deferred = std::max(ctx_->stats.max_deferred, deferred_.size());
  }

  void serve(const deferred& d) { serve(d.from, d.header, {d.keys, nullptr}); }

  // Answers a clock, or a pull (the pull of a push_pull too) with the values of `k`.
  void serve(int from, const request_header& h, const key_list& k) {
    const response_header reply = reply_to(h);
    if (h.what == op::clock) {
      send(from, encode_response<T>(reply, {}));
      return;
    }
    try {
      if (h.length == 0 && !k.keys.empty()) throw error(errc::invalid_argument, "pull with length 0");
      const std::size_t n = k.keys.size() * h.length;
      message m = response_with_room<T>(reply, n);  // the table writes the values in place
      updates_.table_of(h.table).pull(k.keys, std::span<T>(m.values<T>(), n), h.length, k.resolved);
      ++ctx_->stats.pulls;
      ctx_->stats.keys_pulled += k.keys.size();
      send(from, std::move(m));
    } catch (const error& e) {
      send(from, encode_error(reply, code_of(e), e.reason()));
    }
  }

  void save() {
    const shard_state st{static_cast<std::uint32_t>(shard_), static_cast<std::uint32_t>(ctx_->group.shard_count()),
                         updates_.version(), workers_.clocks()};
    checkpoints_.save(updates_.sparse(), updates_.dense(), st, std::min(workers_.slowest(), workers_.fastest()));
  }

  // A reply waits while an update this shard applied is not yet at its chain's tail.
  void send(int to, message bytes) {
    if (chain().holding()) {
      chain().hold(to, std::move(bytes));
    } else {
      ctx_->send_now(to, std::move(bytes));
    }
  }

  server_context<Transport>* ctx_;
  int shard_;
  Consistency consistency_;
  shard_updates<Transport, T, Updater, Initializer> updates_;
  bool heading_;
  bool taken_over_ = false;
  worker_clocks workers_;
  push_rounds<T> rounds_;
  std::list<deferred> deferred_;
  kept_key_lists key_cache_;
  shard_checkpoints checkpoints_;
  std::vector<std::byte> frame_;  // a request taken from where it arrived
  std::vector<bool> told_ = std::vector<bool>(workers_.workers(), false);  // workers that know who joined
};

}  // namespace dtrain::ps
