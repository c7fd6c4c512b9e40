#pragma once
/// @file
/// `ps::worker`: a worker's connection to every server shard. Push and pull sparse keys or
/// dense tensors, finish clocks; each call returns a `request` handle at once, so a worker can
/// overlap communication with compute, and `wait` blocks under a deadline. A heartbeat thread
/// tells the servers the worker is alive.
///
/// @code
/// ps::worker<tcp_transport, ssp<2>> w(std::move(t), roles, ps::range_sharding(servers, 1 << 24));
/// auto pulled = w.pull(keys, std::span(weights), 1);   // sorted, unique keys
/// w.wait(pulled);                                        // waits while SSP says this clock must
/// ... compute gradients ...
/// w.wait(w.push(keys, std::span<const float>(grads), 1));
/// w.wait(w.clock());
/// w.finish();
/// @endcode
/// Not thread-safe: one thread per worker object (the heartbeat thread is internal).
///
/// Nothing is copied on the worker: a request is sent gathered from its header and the caller's
/// keys and values, and a reply's values are received straight into the caller's `out` (each
/// request's reply has its own tag, and its receive is posted before the request leaves). So
/// keys, values and `out` must stay valid, and keys and values unchanged, until the request has
/// been waited for; after a failed request, `out` holds unspecified values.

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

#include "dtrain/concepts/consistency.hpp"
#include "dtrain/concepts/transport.hpp"
#include "dtrain/core/deadline.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/signature.hpp"
#include "dtrain/ps/configuration.hpp"
#include "dtrain/ps/heartbeat.hpp"
#include "dtrain/ps/key_cache.hpp"
#include "dtrain/ps/protocol.hpp"
#include "dtrain/ps/options.hpp"
#include "dtrain/ps/roles.hpp"
#include "dtrain/ps/sharding.hpp"
#include "dtrain/ps/stats.hpp"

namespace dtrain::ps {

template <transport Transport, consistency Consistency, std::floating_point T = float,
          sharding Sharding = range_sharding>
class worker {
 public:
  /// An outstanding operation: one request per server involved.
  class request {
   public:
    request() = default;
    bool empty() const noexcept { return ids_.empty(); }

   private:
    friend class worker;
    std::vector<std::uint64_t> ids_;
  };

  /// Joins the servers: a hello to each, answered within `options.timeout`.
  /// @throws dtrain::error `timeout` naming the servers that did not answer; `invalid_argument`
  ///   if a server was configured differently (counts, consistency model, value type).
  worker(Transport t, roles r, Sharding shards, ps_options o = {})
      : transport_(std::move(t)),
        roles_(r),
        sharding_(std::move(shards)),
        options_(o),
        dense_sharding_(r.servers),
        dense_layout_(o.dense_slice_bytes, sizeof(T)),
        basis_(static_cast<std::size_t>(r.servers), 0),
        key_cache_(r.servers, o.key_cache_lists) {
    if (roles_.is_server(transport_.rank())) {
      throw error(errc::invalid_argument, "ps::worker on rank " + std::to_string(transport_.rank()) + ", a server rank");
    }
    if (sharding_.servers() != roles_.servers) {
      throw error(errc::invalid_argument, "ps::worker: the sharding has " + std::to_string(sharding_.servers()) +
                                              " servers but the group has " + std::to_string(roles_.servers));
    }
    id_ = static_cast<std::uint32_t>(roles_.worker_of(transport_.rank()));
    request hello;
    for (int s = 0; s < roles_.servers; ++s) {
      hello.ids_.push_back(send(s, op::hello, table_id::sparse, config_, std::span<const T>{}, 0, nullptr));
    }
    try {
      wait(hello, deadline::after(options_.timeout));
    } catch (const error& e) {
      std::string missing;
      for (auto id : hello.ids_) {
        if (auto it = pending_.find(id); it != pending_.end() && !it->second.answer->test()) {
          missing += (missing.empty() ? "" : ", ") + std::to_string(it->second.server);
        }
      }
      throw error(code_of(e), "ps::worker " + std::to_string(id_) + ": joining the servers" +
                                  (missing.empty() ? "" : " (no answer from server " + missing + ")") + ": " + e.what());
    }
    // Resumed servers say which clock this worker left off at; all must agree.
    for (std::size_t s = 0; s < hello_clocks_.size(); ++s) {
      if (hello_clocks_[s] != hello_clocks_[0]) {
        throw error(errc::bad_data, "ps::worker " + std::to_string(id_) + ": the servers resumed from different clocks (server 0 at " +
                                        std::to_string(hello_clocks_[0]) + ", server " + std::to_string(s) + " at " +
                                        std::to_string(hello_clocks_[s]) + "); their checkpoints are from different rounds");
      }
    }
    clock_ = hello_clocks_.empty() ? 0 : hello_clocks_[0];
    heartbeat_.emplace(transport_, roles_, options_, id_);
  }

  worker(const worker&) = delete;
  worker& operator=(const worker&) = delete;

  /// Says goodbye if `finish` was not called (errors are swallowed here; call `finish` to see them).
  ~worker() {
    try {
      if (!broken_) finish();
    } catch (...) {
    }
    heartbeat_.reset();
  }

  /// Pushes `values` (keys.size() * length) for sorted, unique `keys` in the current clock.
  /// @throws dtrain::error `invalid_argument` for unsorted or out-of-space keys, or sizes that
  ///   disagree; nothing is sent then.
  request push(std::span<const key_type> keys, std::span<const T> values, std::size_t length) {
    check_length(keys.size(), values.size(), length, "push");
    return sparse_request(op::push, keys, values, {}, length);
  }

  /// Pulls the values of sorted, unique `keys` into `out` (keys.size() * length) once the
  /// consistency model allows; `out` must stay valid until the request is waited for.
  request pull(std::span<const key_type> keys, std::span<T> out, std::size_t length) {
    check_length(keys.size(), out.size(), length, "pull");
    return sparse_request(op::pull, keys, {}, out, length);
  }

  /// `push(keys, values)` then `pull(keys, out)` as one request per server: the keys travel
  /// once, and under ASP and SSP the server applies the push and reads the new values in one
  /// pass (ps-lite's ZPushPull). `out` may not overlap `values`.
  request push_pull(std::span<const key_type> keys, std::span<const T> values, std::span<T> out, std::size_t length) {
    check_length(keys.size(), values.size(), length, "push_pull");
    check_length(keys.size(), out.size(), length, "push_pull");
    return sparse_request(op::push_pull, keys, values, out, length);
  }

  /// Declares a dense tensor of `elements` values (the same tensors, in the same order, on every
  /// worker); returns its index. It is cut into slices of `ps_options::dense_slice_bytes`
  /// (4 MiB) spread over the servers.
  std::size_t add_dense(std::size_t elements) { return dense_layout_.add_tensor(elements, dense_sharding_); }

  /// Pushes all of dense tensor `tensor` (`values.size()` must be its size).
  request push_dense(std::size_t tensor, std::span<const T> values) {
    check_tensor(tensor, values.size());
    return dense_request(op::push, tensor, values, {});
  }

  /// Pulls dense tensor `tensor` into `out` once the consistency model allows.
  request pull_dense(std::size_t tensor, std::span<T> out) {
    check_tensor(tensor, out.size());
    return dense_request(op::pull, tensor, {}, out);
  }

  /// `push_dense(tensor, values)` then `pull_dense(tensor, out)`, one request per slice.
  request push_pull_dense(std::size_t tensor, std::span<const T> values, std::span<T> out) {
    check_tensor(tensor, values.size());
    check_tensor(tensor, out.size());
    return dense_request(op::push_pull, tensor, values, out);
  }

  /// Finishes this worker's current clock on every server. Waiting on it blocks while the
  /// consistency model holds this worker back (BSP: until every worker finished the clock).
  request clock() {
    request r;
    for (int s = 0; s < roles_.servers; ++s) {
      r.ids_.push_back(send(s, op::clock, table_id::sparse, std::span<const key_type>{}, std::span<const T>{}, 0, nullptr));
    }
    ++clock_;
    ++stats_.clocks;
    return r;
  }

  /// Waits for `r` under the worker's timeout. @throws dtrain::error naming the server, the
  ///   operation and the reason: a server's refusal, `timeout`, `peer_lost`.
  void wait(request& r) { wait(r, deadline::after(options_.timeout)); }

  void wait(request& r, deadline d) {
    const auto t0 = std::chrono::steady_clock::now();
    struct mark_broken {  // a wait that throws leaves the worker unable to say goodbye cleanly
      bool& broken;
      bool ok = false;
      ~mark_broken() { broken = broken || !ok; }
    } guard{broken_};
    for (std::uint64_t id : r.ids_) {
      auto it = pending_.find(id);
      if (it == pending_.end()) continue;  // consumed by an earlier wait
      take_reply(it->second, d);
      const std::string failure = std::move(it->second.failure);
      const errc code = it->second.code;
      pending_.erase(it);
      if (!failure.empty()) throw error(code, failure);
    }
    r.ids_.clear();
    guard.ok = true;
    stats_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  /// Says goodbye to every server and waits for them to acknowledge. Idempotent.
  void finish() {
    if (finished_) return;
    finished_ = true;
    request r;
    for (int s = 0; s < roles_.servers; ++s) {
      r.ids_.push_back(send(s, op::goodbye, table_id::sparse, std::span<const key_type>{}, std::span<const T>{}, 0, nullptr));
    }
    wait(r);
    heartbeat_.reset();
  }

  /// Clocks this worker has finished (where a resumed job continues from, right after joining).
  std::int64_t clocks() const noexcept { return clock_; }
  int id() const noexcept { return static_cast<int>(id_); }
  const roles& group() const noexcept { return roles_; }
  const worker_stats& stats() const noexcept { return stats_; }
  const dense_layout& layout() const noexcept { return dense_layout_; }

 private:
  struct destination {
    T* out;
    std::vector<std::uint32_t> positions;  // where each pulled key's values go (in units of length)
    std::size_t length;
    std::size_t run = 0;  // > 0: the values of `run` keys go to out[0, run * length) in order
    std::size_t keys() const noexcept { return run > 0 ? run : positions.size(); }
  };

  using send_handle = decltype(std::declval<Transport&>().isend(0, 0, signature{}, gather_list{}));
  using receive_handle = decltype(std::declval<Transport&>().irecv(0, 0, scatter_list{}, nullptr));

  // One request in flight: what it sends, where its reply lands, and what became of it. Lives in
  // a std::map, so the buffers the transport holds never move.
  struct pending {
    std::uint64_t id = 0;
    int server = 0;
    op what = op::heartbeat;
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

  // A push (values), pull (out) or push_pull (both) of sorted, unique keys, split by server.
  request sparse_request(op what, std::span<const key_type> keys, std::span<const T> values, std::span<T> out,
                         std::size_t length) {
    const bool pushes = what != op::pull, pulls = what != op::push;
    request r;
    for_each_server_share(sharding_, keys, [&](int s, std::span<const key_type> mine, std::size_t first,
                              std::span<const std::uint32_t> positions) {
      std::span<const T> v;
      if (pushes) v = values.subspan(first * length, mine.size() * length);
      std::vector<key_type> own_keys;
      std::vector<T> gathered;
      if (!positions.empty()) {  // scattered keys: the request carries copies of them and their values
        own_keys.assign(mine.begin(), mine.end());
        if (pushes) {
          gathered.resize(positions.size() * length);
          for (std::size_t j = 0; j < positions.size(); ++j) {
            std::copy_n(values.data() + static_cast<std::size_t>(positions[j]) * length, length, gathered.data() + j * length);
          }
        }
      }
      std::optional<destination> d;
      if (pulls) {
        d = positions.empty()  // a run of keys: the reply lands in one run of `out`
                ? destination{out.data() + first * length, {}, length, mine.size()}
                : destination{out.data(), std::vector<std::uint32_t>(positions.begin(), positions.end()), length, 0};
      }
      r.ids_.push_back(send(s, what, table_id::sparse, mine, v, length, d ? &*d : nullptr, std::move(own_keys),
                            std::move(gathered)));
    });
    count(what, keys.size());
    return r;
  }

  // The same for a dense tensor: one request per slice.
  request dense_request(op what, std::size_t tensor, std::span<const T> values, std::span<T> out) {
    request r;
    const auto [first, last] = dense_layout_.slices_of(tensor);
    for (std::size_t i = first; i < last; ++i) {
      const auto& sl = dense_layout_.slices()[i];
      std::optional<destination> d;
      if (what != op::push) d = destination{out.data() + sl.offset, {}, sl.count, 1};
      // The slice's key travels from the request's own copy (the layout may grow meanwhile).
      r.ids_.push_back(send(sl.server, what, table_id::dense, {},
                            what != op::pull ? values.subspan(sl.offset, sl.count) : std::span<const T>{}, sl.count,
                            d ? &*d : nullptr, std::vector<key_type>{sl.key}));
    }
    count(what, dense_layout_.tensor_size(tensor));
    return r;
  }

  void count(op what, std::size_t keys) noexcept {
    if (what != op::pull) {
      ++stats_.pushes;
      stats_.keys_pushed += keys;
    }
    if (what != op::push) {
      ++stats_.pulls;
      stats_.keys_pulled += keys;
    }
  }

  static void check_length(std::size_t keys, std::size_t values, std::size_t length, const char* what) {
    if (length == 0 || values != keys * length) {
      throw error(errc::invalid_argument, std::string("ps::worker ") + what + ": " + std::to_string(keys) +
                                              " keys of length " + std::to_string(length) + " but " +
                                              std::to_string(values) + " values");
    }
  }

  void check_tensor(std::size_t tensor, std::size_t size) const {
    if (tensor >= dense_layout_.tensors()) {
      throw error(errc::invalid_argument, "ps::worker: no dense tensor " + std::to_string(tensor));
    }
    if (size != dense_layout_.tensor_size(tensor)) {
      throw error(errc::invalid_argument, "ps::worker: dense tensor " + std::to_string(tensor) + " has " +
                                              std::to_string(dense_layout_.tensor_size(tensor)) + " values, not " +
                                              std::to_string(size));
    }
  }

  // Sends one request, gathered from its header, `keys` and `values` (or `own_keys` and
  // `own_values` when given: copies the request itself keeps), after posting the receive of its
  // reply: its header into the pending entry, its values (a pull of a run of keys) straight into
  // the caller's buffer.
  std::uint64_t send(int server, op what, table_id which, std::span<const key_type> keys, std::span<const T> values,
                     std::size_t length, const destination* into, std::vector<key_type> own_keys = {},
                     std::vector<T> own_values = {}) {
    const std::uint64_t id = next_id_++;
    pending& p = pending_[id];
    p.id = id;
    p.server = server;
    p.what = what;
    p.own_keys = std::move(own_keys);
    p.own_values = std::move(own_values);
    if (!p.own_keys.empty()) keys = p.own_keys;
    if (!p.own_values.empty()) values = p.own_values;
    if constexpr (std::endian::native != std::endian::little) {  // keys travel little-endian
      if (p.own_keys.empty()) p.own_keys.assign(keys.begin(), keys.end());
      for (auto& k : p.own_keys) k = __builtin_bswap64(k);
      keys = p.own_keys;
    }
    request_header h{what, which, id, clock_, basis_[static_cast<std::size_t>(server)], keys.size(),
                     static_cast<std::uint32_t>(length), id_};
    if (carries_keys(what) && which == table_id::sparse && options_.key_cache_lists > 0 && keys.size() >= options_.key_cache_min_keys) {
      const auto [slot, hit] = key_cache_.slot_for(server, keys);
      h.cache = hit ? key_cache::use : key_cache::store;
      h.cache_slot = slot;
      if (hit) keys = {};  // the server has them
    }
    encode_request_header(h, h.cache == key_cache::use ? h.keys : keys.size(), std::span(p.request));
    if (into != nullptr) {
      p.into = *into;
      if (into->run > 0) p.reply_values = std::as_writable_bytes(std::span(into->out, into->run * into->length));
    }
    // A pull of scattered keys has no run to land in: its values come whole into the overflow.
    const std::span<std::byte> reply_parts[] = {std::span(p.reply), p.reply_values};
    p.answer.emplace(transport_.irecv(roles_.server_rank(server), reply_tag(options_.tag, id),
                                      scatter_list(reply_parts), &p.overflow));
    const std::span<const std::byte> request_parts[] = {std::span<const std::byte>(p.request), std::as_bytes(keys),
                                                        std::as_bytes(values)};
    p.sent.emplace(transport_.isend(roles_.server_rank(server), options_.tag, signature{}, gather_list(request_parts)));
    stats_.bytes_out += header_bytes + keys.size_bytes() + values.size_bytes();
    return id;
  }

  // Waits for the reply to `p` under `d` and reads it: a refusal becomes `p.failure`; a pull's
  // values are already in place (a run of keys) or are copied to their positions.
  void take_reply(pending& p, deadline d) {
    const int server = roles_.server_rank(p.server);
    std::error_code ec;
    if (!p.answer->wait(d, ec)) {
      throw error(ec, "ps::worker " + std::to_string(id_) + ": waiting for server " + std::to_string(p.server) +
                          " to answer a " + op_name(p.what));
    }
    p.sent->wait(d);  // written before the server could answer; this only collects its status
    const std::size_t bytes = p.answer->info().bytes;
    stats_.bytes_in += bytes;
    const bool whole = bytes > header_bytes + p.reply_values.size();  // it came into the overflow
    const std::span<const std::byte> message = whole ? std::span<const std::byte>(p.overflow) : std::span<const std::byte>(p.reply);
    const response_header h = decode_response(message.first(std::min(bytes, message.size())), server);
    const std::span<const std::byte> payload =
        whole ? message.subspan(header_bytes) : std::span<const std::byte>(p.reply_values).first(bytes - header_bytes);
    const std::string from = "ps::worker " + std::to_string(id_) + ": server " + std::to_string(server);
    if (h.id != p.id) {
      p.failure = from + " answered request " + std::to_string(h.id) + " on the tag of another";
      return;
    }
    if (p.what == op::hello && h.status == 0) {
      hello_clocks_.resize(static_cast<std::size_t>(roles_.servers), 0);
      hello_clocks_[static_cast<std::size_t>(p.server)] = h.slowest;
    }
    if (h.status != 0) {
      p.code = static_cast<errc>(h.status);
      p.failure = from + " refused a " + op_name(p.what) + ": " +
                  std::string(reinterpret_cast<const char*>(payload.data()), payload.size());
      return;
    }
    if (!p.into) return;
    const destination& dst = *p.into;
    if (payload.size() != dst.keys() * dst.length * sizeof(T)) {
      p.failure = from + " sent " + std::to_string(payload.size()) + " bytes for a pull of " + std::to_string(dst.keys()) + " keys";
      return;
    }
    for (std::size_t j = 0; j < dst.positions.size(); ++j) {  // scattered keys; a run is in place
      std::memcpy(dst.out + static_cast<std::size_t>(dst.positions[j]) * dst.length,
                  payload.data() + j * dst.length * sizeof(T), dst.length * sizeof(T));
    }
    auto& basis = basis_[static_cast<std::size_t>(p.server)];
    ++stats_.pull_advance_histogram[std::min<std::size_t>(h.version - std::min(h.version, basis), 32)];
    basis = std::max(basis, h.version);
  }

  Transport transport_;
  roles roles_;
  Sharding sharding_;
  ps_options options_;
  consistent_hash_sharding dense_sharding_;
  dense_layout dense_layout_;
  std::vector<std::uint64_t> basis_;  // per server: the version of the last pull
  sent_key_lists key_cache_;
  std::uint32_t id_ = 0;
  std::int64_t clock_ = 0;
  std::vector<std::int64_t> hello_clocks_;
  // What a hello carries (as keys), checked by every server.
  const std::array<std::uint64_t, 5> config_ =
      job_configuration{roles_, Consistency::name, sizeof(T), options_.replicas}.words();
  std::uint64_t next_id_ = 1;
  std::map<std::uint64_t, pending> pending_;  // declared after transport_: its receives go first
  worker_stats stats_;
  bool finished_ = false, broken_ = false;
  std::optional<heartbeat<Transport, T>> heartbeat_;  // last: stopped first
};

}  // namespace dtrain::ps
