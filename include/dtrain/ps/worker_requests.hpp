#pragma once
/// @file
/// `ps::worker_requests`: a worker's requests in flight. Each is sent gathered from its header
/// and the caller's keys and values, after the receive of its reply is posted (its values land
/// in the caller's buffer); each goes to the head of the shard it addresses. With more than one
/// copy of each shard, a request whose server is lost goes to the next copy (fail-over): the
/// chains close over the lost server as the servers' do (ps/chain.hpp), every request it had not
/// answered is sent again, in order, marked as such, and under a barrier model so are the pushes
/// it acknowledged whose round is not yet answered (kept until then).

#include <array>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/concepts/transport.hpp"
#include "dtrain/core/deadline.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/signature.hpp"
#include "dtrain/detail/log.hpp"
#include "dtrain/ps/chain.hpp"
#include "dtrain/ps/key_cache.hpp"
#include "dtrain/ps/options.hpp"
#include "dtrain/ps/protocol.hpp"
#include "dtrain/ps/roles.hpp"
#include "dtrain/ps/stats.hpp"

namespace dtrain::ps {

template <transport Transport, class T>
class worker_requests {
 public:
  /// Where a pull's values go: a run of `out`, or scattered positions of it.
  struct destination {
    T* out;
    std::vector<std::uint32_t> positions;  // where each pulled key's values go (in units of length)
    std::size_t length;
    std::size_t run = 0;  // > 0: the values of `run` keys go to out[0, run * length) in order
    std::size_t keys() const noexcept { return run > 0 ? run : positions.size(); }
  };

 private:
  using send_handle = decltype(std::declval<Transport&>().isend(0, 0, signature{}, gather_list{}));
  using receive_handle = decltype(std::declval<Transport&>().irecv(0, 0, scatter_list{}, nullptr));

  // One request in flight: what it sends, where its reply lands, and what became of it. Lives in
  // a std::map, so the buffers the transport holds never move.
  struct pending {
    std::uint64_t id = 0;
    int shard = 0;
    int server = 0;  // the shard's head it went to
    op what = op::heartbeat;
    request_header header;                    // as sent first (a re-send carries every key)
    std::span<const key_type> keys;           // what it carries (the caller's, or own_keys)
    std::span<const T> values;
    bool kept = false;                        // a push kept until its round's clock is answered
    bool waited = false;
    std::optional<destination> into;
    std::string failure;
    errc code = errc::protocol_error;
    std::array<std::byte, header_bytes> request{};  // the request's header, sent first
    std::vector<key_type> own_keys;                  // keys the request carries that the caller does not hold
    std::vector<T> own_values;                       // likewise its values
    std::array<std::byte, header_bytes> reply{};     // the reply's header lands here...
    std::span<std::byte> reply_values;               // ...and its values here (the caller's buffer)
    std::vector<std::byte> overflow;                 // a reply that does not fit those (an error's text)
    std::optional<send_handle> sent;
    std::optional<receive_handle> answer;
  };

 public:
  /// @param fails_over send requests to the next copy when a server is lost
  /// @param keeps_pushes keep pushes until their round's clock is answered (barrier models)
  worker_requests(Transport& t, roles r, const ps_options& o, std::uint32_t worker, bool fails_over, bool keeps_pushes,
                  worker_stats& stats)
      : transport_(t), roles_(r), options_(o), id_(worker), fails_over_(fails_over), keeps_pushes_(keeps_pushes),
        chains_(r.servers, o.replicas, r.shard_count()), basis_(static_cast<std::size_t>(r.shard_count()), 0),
        key_cache_(r.shard_count(), o.key_cache_lists), stats_(stats) {
    stats_.pushes_acknowledged.assign(static_cast<std::size_t>(r.shard_count()), 0);
  }

  /// Waits for the replies of `ids` under `d`, in order.
  /// @throws dtrain::error naming the server, the operation and the reason: a server's refusal,
  ///   `timeout`, `peer_lost` (with one copy, or every copy lost)
  void wait(const std::vector<std::uint64_t>& ids, deadline d) {
    for (std::uint64_t id : ids) {
      auto it = pending_.find(id);
      if (it == pending_.end() || it->second.waited) continue;  // consumed by an earlier wait
      take_reply(it->second, d);
      const std::string failure = std::move(it->second.failure);
      const errc code = it->second.code;
      if (it->second.kept && failure.empty()) {
        it->second.waited = true;  // kept until its round's clock is answered
      } else {
        pending_.erase(it);
      }
      if (!failure.empty()) throw error(code, failure);
    }
  }

  /// The servers of `ids` that have not answered, as "0, 2".
  std::string unanswered(const std::vector<std::uint64_t>& ids) const {
    std::string missing;
    for (auto id : ids) {
      if (auto it = pending_.find(id); it != pending_.end() && !it->second.answer->test()) {
        missing += (missing.empty() ? "" : ", ") + std::to_string(it->second.server);
      }
    }
    return missing;
  }

  /// The clock each server's hello reply named (where a resumed server left off).
  const std::vector<std::int64_t>& hello_clocks() const noexcept { return hello_clocks_; }
  /// Whether this worker found server `s` lost.
  bool lost(int s) const { return chains_.lost(s); }
  /// The latest clock a shard named in reply to a late worker's `enter`.
  std::int64_t entry_clock() const noexcept { return entry_clock_; }

  // Sends one request to the head of `shard` (a hello to server `shard`), gathered from its
  // header, `keys` and `values` (or `own_keys` and `own_values` when given: copies the request
  // itself keeps), after posting the receive of its reply: its header into the pending entry,
  // its values (a pull of a run of keys) straight into the caller's buffer.
  std::uint64_t send(int shard, op what, table_id which, std::span<const key_type> keys, std::span<const T> values,
                     std::size_t length, const destination* into, std::int64_t clock,
                     std::vector<key_type> own_keys = {}, std::vector<T> own_values = {}) {
    const std::uint64_t id = next_id_++;
    pending& p = pending_[id];
    p.id = id;
    p.shard = shard;
    p.server = what == op::hello ? shard : head_of(shard);
    p.what = what;
    p.kept = keeps_pushes_ && what == op::push;
    if (p.kept) {  // the caller may reuse its buffers once the push is acknowledged
      if (own_keys.empty()) own_keys.assign(keys.begin(), keys.end());
      if (own_values.empty()) own_values.assign(values.begin(), values.end());
    }
    p.own_keys = std::move(own_keys);
    p.own_values = std::move(own_values);
    if (!p.own_keys.empty()) keys = p.own_keys;
    if (!p.own_values.empty()) values = p.own_values;
    if constexpr (std::endian::native != std::endian::little) {  // keys travel little-endian
      if (p.own_keys.empty()) p.own_keys.assign(keys.begin(), keys.end());
      for (auto& k : p.own_keys) k = __builtin_bswap64(k);
      keys = p.own_keys;
    }
    request_header h{what, which, id, clock, basis_[static_cast<std::size_t>(shard)], keys.size(),
                     static_cast<std::uint32_t>(length), id_};
    h.shard = static_cast<std::uint32_t>(shard);
    p.header = h;
    p.keys = keys;
    p.values = values;
    if (carries_keys(what) && which == table_id::sparse && options_.key_cache_lists > 0 &&
        keys.size() >= options_.key_cache_min_keys) {
      const auto [slot, hit] = key_cache_.slot_for(shard, keys);
      h.cache = hit ? key_cache::use : key_cache::store;
      h.cache_slot = slot;
      if (hit) keys = {};  // the server has them
    }
    encode_request_header(h, h.cache == key_cache::use ? h.keys : keys.size(), std::span(p.request));
    if (into != nullptr) {
      p.into = *into;
      if (into->run > 0) p.reply_values = std::as_writable_bytes(std::span(into->out, into->run * into->length));
    }
    post(p, keys);
    return id;
  }

 private:

  // Posts the receive of `p`'s reply and sends `p` (its header, then `keys` and its values) to
  // the server it goes to.
  void post(pending& p, std::span<const key_type> keys) {
    // A pull of scattered keys has no run to land in: its values come whole into the overflow.
    const std::span<std::byte> reply_parts[] = {std::span(p.reply), p.reply_values};
    const int rank = roles_.server_rank(p.server);
    p.answer.emplace(transport_.irecv(rank, reply_tag(options_.tag, p.id), scatter_list(reply_parts), &p.overflow));
    const std::span<const std::byte> request_parts[] = {std::span<const std::byte>(p.request), std::as_bytes(keys),
                                                        std::as_bytes(p.values)};
    p.sent.emplace(transport_.isend(rank, options_.tag, signature{}, gather_list(request_parts)));
    stats_.bytes_out += header_bytes + keys.size_bytes() + p.values.size_bytes();
  }

  // The live head of `shard`. @throws dtrain::error `peer_lost` when every copy is lost
  int head_of(int shard) const {
    const int h = chains_.head(shard);
    if (h < 0) {
      throw error(errc::peer_lost, "ps::worker " + std::to_string(id_) + ": every copy of shard " +
                                       std::to_string(shard) + " is lost (" + std::to_string(options_.replicas) +
                                       (options_.replicas == 1 ? " replica)" : " replicas)"));
    }
    return h;
  }

  // Server `server` is lost: the chains close over it and every request it had not answered
  // goes to its shard's new head, in the order first sent, marked as sent again; so do the
  // pushes it acknowledged but its chain may not hold (kept), whose replies are awaited here.
  void lose(int server) {
    if (!chains_.lost(server)) {
      chains_.lose(server);
      dtrain::detail::log(dtrain::detail::log_level::warn, "ps::worker " + std::to_string(id_) + ": server " +
                                                               std::to_string(server) +
                                                               " is lost; its shards go to the next copies");
    }
    send_again(server, -1);
  }

  // Server `server` gave up its copy of `shard` (it moved, `shard_moved`): that chain closes
  // over it, and what it had not answered for the shard, or answered `shard_moved`, goes to the
  // new head as after a loss.
  void moved(int server, int shard) {
    if (!chains_.left(shard, server)) {
      chains_.leave(shard, server);
      dtrain::detail::log(dtrain::detail::log_level::info, "ps::worker " + std::to_string(id_) + ": shard " +
                                                               std::to_string(shard) + " moved from server " +
                                                               std::to_string(server) + " to server " +
                                                               std::to_string(head_of(shard)));
    }
    send_again(server, shard);  // every time: what it answered `shard_moved` since goes too
  }

  // Sends the requests `server` had not answered (or answered `shard_moved`) for `shard` (-1:
  // any) to their shards' heads now, and waits for the kept pushes among them.
  void send_again(int server, int shard) {
    std::vector<pending*> again;
    for (auto& [id, p] : pending_) {
      if (p.server == server && (shard < 0 || p.shard == shard) && p.what != op::hello &&
          (p.waited || !answered(p) || answered_moved(p))) {
        again.push_back(&p);
      }
    }
    for (pending* p : again) {
      key_cache_.forget(p->shard);
      p->server = head_of(p->shard);
      request_header h = p->header;
      h.flags |= resent;
      h.cache = key_cache::none;  // the new head holds none of this worker's key lists
      encode_request_header(h, p->keys.size(), std::span(p->request));
      post(*p, p->keys);
    }
    for (pending* p : again) {
      if (!p->waited) continue;
      take_reply(*p, deadline::after(options_.timeout));
      if (!p->failure.empty()) throw error(p->code, p->failure);
    }
  }

  // Whether `p`'s reply arrived (a failure is no answer).
  static bool answered(pending& p) {
    if (!p.answer->test()) return false;
    std::error_code ec;
    return p.answer->wait(deadline::after(std::chrono::milliseconds(0)), ec);
  }

  // Whether `p`'s reply came whole into the overflow (an error's text, a pull of scattered keys),
  // rather than its header into `reply` and its values in place. @pre answered(p)
  static bool came_whole(const pending& p) { return p.answer->info().bytes > header_bytes + p.reply_values.size(); }

  // Whether `p`'s reply arrived and says its shard moved. @pre answered(p)
  static bool answered_moved(const pending& p) {
    const std::span<const std::byte> header =
        came_whole(p) ? std::span<const std::byte>(p.overflow) : std::span<const std::byte>(p.reply);
    return p.answer->info().bytes >= header_bytes && header.size() >= header_bytes &&
           static_cast<std::uint8_t>(header[5]) == shard_moved;
  }

  // Shard `shard`'s head answered the clock `clock`: its chain holds that round, and the pushes
  // kept for it (and before) are no longer needed.
  void forget_committed(int shard, std::int64_t clock) {
    for (auto it = pending_.begin(); it != pending_.end();) {
      const pending& k = it->second;
      it = k.waited && k.shard == shard && k.header.clock <= clock ? pending_.erase(it) : std::next(it);
    }
  }

  // Waits for the reply to `p` under `d` (sending it again to a new head while its server is
  // lost and the shard has another copy) and reads it: a refusal becomes `p.failure`; a pull's
  // values are already in place (a run of keys) or are copied to their positions.
  void take_reply(pending& p, deadline d) {
    while (!take_answer(p, d)) moved(p.server, p.shard);  // sends `p` (and the rest) to the new head
  }

  // take_reply for one answer: @returns false if it says the shard moved.
  bool take_answer(pending& p, deadline d) {
    for (std::error_code ec; !p.answer->wait(d, ec);) {
      if (ec == errc::peer_lost && fails_over_ && p.what == op::hello) {
        // Lost before this worker joined (a late worker, coming after a fail-over): the next
        // copies head its shards, and each of them answers this worker's hello as a server.
        lose(p.server);
        std::error_code gone;
        p.sent->wait(d, gone);
        return true;
      }
      if (ec != errc::peer_lost || !fails_over_) {
        throw error(ec, "ps::worker " + std::to_string(id_) + ": waiting for server " + std::to_string(p.server) +
                            " to answer a " + op_name(p.what) +
                            (p.answer->detail().empty() ? "" : " (" + p.answer->detail() + ")"));
      }
      lose(p.server);  // sends `p` to its shard's new head
    }
    const int server = roles_.server_rank(p.server);
    p.sent->wait(d);  // written before the server could answer; this only collects its status
    const std::size_t bytes = p.answer->info().bytes;
    stats_.bytes_in += bytes;
    const bool whole = came_whole(p);
    const std::span<const std::byte> message =
        whole ? std::span<const std::byte>(p.overflow) : std::span<const std::byte>(p.reply);
    const response_header h = decode_response(message.first(std::min(bytes, message.size())), server);
    const std::span<const std::byte> payload =
        whole ? message.subspan(header_bytes) : std::span<const std::byte>(p.reply_values).first(bytes - header_bytes);
    const std::string from = "ps::worker " + std::to_string(id_) + ": server " + std::to_string(server);
    if (h.id != p.id) {
      p.failure = from + " answered request " + std::to_string(h.id) + " on the tag of another";
      return true;
    }
    if (p.what == op::hello && h.status == 0) {
      hello_clocks_.resize(static_cast<std::size_t>(roles_.servers), 0);
      hello_clocks_[static_cast<std::size_t>(p.server)] = h.slowest;
    }
    if (p.what == op::enter && h.status == 0) entry_clock_ = std::max(entry_clock_, h.slowest);
    for (std::uint32_t j : h.joined) {  // servers that joined the shard's chain, in order
      if (j != 0) chains_.join(p.shard, static_cast<int>(j) - 1);
    }
    if (h.status == shard_moved) return false;
    if (h.status != 0) {
      p.code = static_cast<errc>(h.status);
      p.failure = from + " refused a " + op_name(p.what) + ": " +
                  std::string(reinterpret_cast<const char*>(payload.data()), payload.size());
      return true;
    }
    if (p.what == op::clock) forget_committed(p.shard, p.header.clock);
    if (!p.waited && (p.what == op::push || p.what == op::push_pull))
      ++stats_.pushes_acknowledged[static_cast<std::size_t>(p.shard)];
    if (!p.into) return true;
    const destination& dst = *p.into;
    if (payload.size() != dst.keys() * dst.length * sizeof(T)) {
      p.failure = from + " sent " + std::to_string(payload.size()) + " bytes for a pull of " +
                  std::to_string(dst.keys()) + " keys";
      return true;
    }
    for (std::size_t j = 0; j < dst.positions.size(); ++j) {  // scattered keys; a run is in place
      std::memcpy(dst.out + static_cast<std::size_t>(dst.positions[j]) * dst.length,
                  payload.data() + j * dst.length * sizeof(T), dst.length * sizeof(T));
    }
    auto& basis = basis_[static_cast<std::size_t>(p.shard)];
    ++stats_.pull_advance_histogram[std::min<std::size_t>(h.version - std::min(h.version, basis), 32)];
    basis = std::max(basis, h.version);
    return true;
  }


  Transport& transport_;
  roles roles_;
  const ps_options& options_;
  std::uint32_t id_;
  bool fails_over_, keeps_pushes_;
  chain_layout chains_;  // which servers this worker found lost
  std::vector<std::uint64_t> basis_;  // per shard: the version of the last pull
  sent_key_lists key_cache_;
  std::vector<std::int64_t> hello_clocks_;
  std::int64_t entry_clock_ = 0;
  std::uint64_t next_id_ = 1;
  std::map<std::uint64_t, pending> pending_;
  worker_stats& stats_;
};

}  // namespace dtrain::ps
