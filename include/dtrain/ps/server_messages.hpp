#pragma once
/// @file
/// `ps::server_messages`: what one server does with the messages of the other servers: the
/// updates, acknowledgements and joins of the chains it is in (handed to the shard they name),
/// the state of a shard it asked to join, a standby's taking a place, and the end of the job.
/// A CRTP part of `ps::server` (ps/server.hpp), which routes a server's message here and
/// whose state it shares through `self()`; the workers' requests stay in the server.

#include <cstddef>
#include <ranges>
#include <span>
#include <string>

#include "dtrain/concepts/sharding.hpp"
#include "dtrain/core/deadline.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/detail/log.hpp"
#include "dtrain/ps/protocol.hpp"

namespace dtrain::ps {

template <class Server>
class server_messages {
 protected:
  // An update, acknowledgement or goodbye from another server, for the shard it names.
  template <class Request>
  void on_server_message(int from, const Request& r) {
    Server& sv = self();
    if (r.header.what == op::state) return install(from, r);
    if (r.header.what == op::hand_over) return sv.membership_.take_place_of(from);
    if (r.header.what == op::leave) return sv.membership_.on_left(from, static_cast<int>(r.header.shard));
    if (r.header.what == op::done) return on_server_done();
    const auto it = sv.shards_.find(static_cast<int>(r.header.shard));
    const std::string what = std::string(op_name(r.header.what)) + " of shard " + std::to_string(r.header.shard);
    auto sender = [&] { return lead() + "server " + std::to_string(from); };  // for errors and logs only
    if (it == sv.shards_.end() && sv.ctx_.layout.left(static_cast<int>(r.header.shard), sv.me()))
      return;  // it moved: news of it is moot
    if (it == sv.shards_.end())
      sv.fail(errc::protocol_error, sender() + " sent a " + what + ", which this server holds no copy of");
    const bool fits = it->second.chain().fits(r.header.what, from) == Server::fit::yes;
    if (!fits && sv.ctx_.layout.gone(static_cast<int>(r.header.shard), from)) {
      // Kept back until news of a loss, and its sender lost since: what it said no longer
      // applies (the chain closed over it, and what it had not passed on is sent again).
      dtrain::detail::log(dtrain::detail::log_level::debug,
                          lead() + "dropping a " + what + " from server " + std::to_string(from) + ", lost since");
      return;
    }
    if (!fits) {
      sv.fail(errc::protocol_error, sender() + " sent a " + what + " out of its chain (" +
                                        std::to_string(sv.ctx_.layout.replicas()) + " replicas on " +
                                        std::to_string(sv.ctx_.group.servers) + " servers)");
    }
    try {
      if (r.header.what == op::join) {
        dtrain::detail::log(dtrain::detail::log_level::warn,
                            sender() + " joins shard " + std::to_string(it->first) + "'s chain");
        it->second.on_join(from);
      } else {
        it->second.on_server_message(from, r);
      }
    } catch (const error& e) {
      sv.fail(code_of(e), e.reason());
    }
  }

  // The state of a shard this standby asked to join, from the copy that was its tail.
  template <class Request>
  void install(int from, const Request& r) {
    Server& sv = self();
    const int s = static_cast<int>(r.header.shard);
    if (const auto held = sv.shards_.find(s); held != sv.shards_.end()) {  // sent again after a loss
      using again = typename Server::chain::again;
      if (held->second.chain().state_again(sv.ctx_.transport, r.header.id) != again::reinstall) return;
      held->second.chain().flush(deadline::after(sv.ctx_.options.timeout));  // its sends hold its buffers
      sv.shards_.erase(held);
    } else if (!sv.replacing().joined(s)) {
      sv.fail(errc::protocol_error, lead() + "server " + std::to_string(from) + " sent the state of shard " +
                                        std::to_string(s) + ", which this server did not ask to join");
    }
    auto& held = sv.shards_.try_emplace(s, sv.ctx_, s, sv.consistency_, sv.updater_, sv.init_, sv.mode_).first->second;
    try {
      held.install(from, r.values);
    } catch (const error& e) {
      sv.fail(code_of(e), e.reason());
    }
    // The move's progress: which shards are here, how big each was, how many are still to come.
    dtrain::detail::log(dtrain::detail::log_level::warn,
                        "ps::server " + std::to_string(sv.me()) + " holds a copy of shard " + std::to_string(s) +
                            " now (version " + std::to_string(held.updates().version()) + ", " +
                            std::to_string(r.values.size()) + " bytes of state, " +
                            std::to_string(sv.replacing().still_to_join()) + " more to come, from server " +
                            std::to_string(from) + ")");
  }

  // This server ended its job: every worker said goodbye to it, so every worker is done. The
  // standbys hear it before this server's connection ends, so they do not take that end for a
  // loss (a worker's own `worker_done` may still be on its way to them).
  // Best effort, as the workers' message: a standby that finished is gone, and a late one that
  // never came never reads it.
  void tell_standbys_done() {
    using T = typename Server::value_type;
    Server& sv = self();
    const request_header h{op::done, table_id::sparse, 0, 0, 0, 0, 0, 0};
    auto standbys = std::views::iota(0, sv.ctx_.group.size()) | std::views::filter([&sv](int s) {
                      return s != sv.me() && sv.ctx_.group.is_standby(s) && !sv.ctx_.layout.lost(s);
                    });
    send_notice(sv.ctx_.transport, standbys, sv.ctx_.options.tag,
                encode_request<T>(h, std::span<const key_type>{}, std::span<const T>{}), sv.ctx_.options.timeout);
  }

  // A server ended its job. A standby that heads no shard takes it as every worker's
  // `worker_done` (no goodbye comes to it); one that heads shards waits for the workers'
  // goodbyes to them, as any head does.
  void on_server_done() {
    Server& sv = self();
    if (sv.replacing().joining()) return;
    for (auto& [s, held] : sv.shards_) {
      if (held.heading()) return;
    }
    for (std::size_t w = 0; w < sv.liveness_.workers(); ++w) sv.liveness_.finished(w);
  }

 private:
  Server& self() noexcept { return static_cast<Server&>(*this); }
  std::string lead() { return "ps::server " + std::to_string(self().me()) + ": "; }
};

}  // namespace dtrain::ps
