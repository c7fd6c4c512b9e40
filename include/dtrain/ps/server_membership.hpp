#pragma once
/// @file
/// `ps::server_membership`: which shards one server holds and heads, as the job's servers
/// change. A standby takes the place of a lost server, or of one leaving that hands its place
/// over (ps/replacements.hpp decides whose); a growing server joins the shards it grows into,
/// whose first copies then give them up (ps/shard_moves.hpp); and a copy heads a shard once the
/// heads before it are gone. It works on the server's shards and sends what these take; the
/// server (ps/server.hpp) routes the messages here.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dtrain/concepts/transport.hpp"
#include "dtrain/core/deadline.hpp"
#include "dtrain/detail/log.hpp"
#include "dtrain/ps/protocol.hpp"
#include "dtrain/ps/replacements.hpp"
#include "dtrain/ps/server_context.hpp"
#include "dtrain/ps/shard_moves.hpp"
#include "dtrain/ps/worker_clocks.hpp"

namespace dtrain::ps {

template <transport Transport, class T, class Replica>
class server_membership {
 public:
  using log_level = dtrain::detail::log_level;

  server_membership(server_context<Transport>& ctx, std::map<int, Replica>& shards, worker_clocks& liveness)
      : ctx_(&ctx), shards_(&shards), liveness_(&liveness), replacing_(ctx.group, ctx.me()) {}

  replacements& replacing() noexcept { return replacing_; }
  const replacements& replacing() const noexcept { return replacing_; }

  /// A growing server asks to join the shards it grows into (once the server runs).
  void start() {
    if (replacing_.grow(ctx_->layout)) ask_to_join();
  }

  /// Server `s` is lost: the chains close over it.
  void lose(int s) {
    ctx_->layout.lose(s);
    replacing_.lost(s);
  }

  /// After losses: this server heads what it now should, and a standby whose turn came joins
  /// the lost server's chains (while workers remain).
  void after_losses(log_level level) {
    take_over_shards(level);
    if (liveness_->live() > 0) replace_lost();
  }

  /// This standby takes server `s`'s place in every chain `s` is in: lost, or leaving (it handed
  /// its place over, `hand_over`).
  void take_place_of(int s) {
    if (replacing_.take_place_of(s, ctx_->layout, [&](int shard) { return shards_->count(shard) != 0; }))
      return ask_to_join();
    say(log_level::warn, " cannot take server " + std::to_string(s) + "'s place: it takes server " +
                             std::to_string(replacing_.replacing()) + "'s, or is no standby");
  }

  /// A server leaving hands its place to the standby that would take it were it lost (the next
  /// one, in the order of losses), which joins its chains at once: no shard is ever short of a
  /// copy, and the order of losses every process sees stays the order of replacements.
  void hand_over() {
    const auto to = replacing_.hand_over(ctx_->layout);
    if (!to) return;
    ctx_->template ask_server<T>(*to, op::hand_over, no_worker);  // names no shard
    say(log_level::warn, " leaves: standby server " + std::to_string(*to) + " takes its place in " +
                             std::to_string(shards_->size()) + " chains first");
  }

  /// Whether this server gives up shard `s` once its chain holds everything (`move_shards`).
  bool moves_away(int s) const {
    if (!ps::moves_away(ctx_->layout, ctx_->group, ctx_->me(), s))
      return false;  // first: no lookup unless the job grows
    const auto it = shards_->find(s);
    return it != shards_->end() && it->second.heading();
  }

  /// Gives up each shard that moves away once everything this server applied to it is at its
  /// tail: the chain's other members close it over this server (`leave`), and the requests that
  /// wait here are answered `shard_moved`, so their workers send them to the new head.
  void move_shards() {
    for (auto it = shards_->begin(); it != shards_->end();) {
      const int s = it->first;
      if (!moves_away(s) || it->second.chain().holding()) {
        ++it;
        continue;
      }
      for (int member : ctx_->layout.chain(s)) {
        if (member != ctx_->me()) ctx_->template ask_server<T>(member, op::leave, static_cast<std::uint32_t>(s));
      }
      ctx_->layout.leave(s, ctx_->me());
      it->second.abandon([&](int to, op what, std::uint64_t id, int shard) {
        ctx_->send_now(
            to, moved_reply(ctx_->layout, ctx_->group, ctx_->answer_to(what, id, static_cast<std::uint32_t>(shard))));
      });
      say(log_level::warn, " gives shard " + std::to_string(s) + " (version " +
                               std::to_string(it->second.updates().version()) + ") to server " +
                               std::to_string(ctx_->group.grows_into(s)) +
                               ", which the job grew by; its chain is now " + chain_text(ctx_->layout, s));
      it->second.chain().flush(deadline::after(ctx_->options.timeout));  // its sends hold its buffers
      it = shards_->erase(it);
    }
  }

  /// Server `from` gave up its copy of shard `s`: the chain closes over it.
  void on_left(int from, int s) {
    ctx_->layout.leave(s, from);
    take_over_shards(log_level::warn);
  }

 private:
  // Standby i takes the place of the i-th server lost: it asks the head of every chain that
  // server was in to add it; and again after each loss until the state is here (the copy that
  // was to send it may be the one lost).
  void replace_lost() {
    if (const auto lost = replacing_.due()) return take_place_of(*lost);
    ask_to_join();
  }

  void ask_to_join() {
    for (int s : replacing_.to_join(ctx_->layout)) {
      const int head = ctx_->layout.head(s), whose = replacing_.replacing();
      ctx_->template ask_server<T>(head, op::join, static_cast<std::uint32_t>(s));
      say(log_level::warn, (whose >= 0 ? " takes server " + std::to_string(whose) + "'s place in shard "
                                       : " adds capacity: it joins shard ") +
                               std::to_string(s) + "'s chain (head: server " + std::to_string(head) + ")");
    }
  }

  // The chains changed (a server lost, or one gave up a shard): this server heads the shards
  // whose heads before it are gone. Under ASP and SSP they start from the workers' clocks as
  // this server's own shard saw them.
  void take_over_shards(log_level level) {
    const auto own = shards_->find(ctx_->me());
    const std::vector<std::int64_t> clocks = own != shards_->end() && own->second.heading()
                                                 ? own->second.workers().clocks()
                                                 : std::vector<std::int64_t>(liveness_->workers(), 0);
    for (auto& [s, held] : *shards_) {
      held.chain_changed();
      if (!held.heading() && ctx_->layout.head(s) == ctx_->me()) {
        say(level, " heads shard " + std::to_string(s) + " now");
        held.take_over(clocks, *liveness_);
      }
    }
  }

  void say(log_level level, const std::string& what) const {
    dtrain::detail::log(level, "ps::server " + std::to_string(ctx_->me()) + what);
  }

  server_context<Transport>* ctx_;
  std::map<int, Replica>* shards_;
  worker_clocks* liveness_;
  replacements replacing_;  // who takes whose place: losses, this standby's joins, a hand-over
};

}  // namespace dtrain::ps
