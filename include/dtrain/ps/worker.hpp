#pragma once
/// @file
/// `ps::worker`: a worker's connection to every server shard. Push and pull sparse keys or
/// dense tensors, finish clocks; each call returns a `request` handle at once, so a worker can
/// overlap communication with compute, and `wait` blocks under a deadline. A heartbeat thread
/// tells the servers the worker is alive.
///
/// <!-- frame: header_ps_worker -->
/// @code
/// ps::worker<tcp_transport, ssp<2>> w(std::move(t), roles, ps::range_sharding(roles.shard_count(), 1 << 24));
/// auto pulled = w.pull(keys, std::span(weights), 1);   // sorted, unique keys
/// w.wait(pulled);                                        // waits while SSP says this clock must
/// // ... compute gradients ...
/// auto pushed = w.push(keys, std::span<const float>(grads), 1);
/// w.wait(pushed);
/// auto clocked = w.clock();
/// w.wait(clocked);
/// w.finish();
/// @endcode
/// Not thread-safe: one thread per worker object (the heartbeat thread is internal).
///
/// Requests go to the head of the shard they address. With `ps_options::replicas` k > 1 a lost
/// server (its connection breaks) is a fail-over, not an error, under ASP, SSP and BSP: the
/// worker closes the chains over it, as the servers do (ps/chain.hpp), and sends the new heads,
/// in order, every request the lost one had not answered, and under BSP the pushes of rounds it
/// had acknowledged but its chain's tail may not hold yet (the worker keeps a copy of each push
/// until its round's clock is answered). The new heads apply each exactly once. Under soft sync a
/// lost server is an error, as with one replica.
///
/// Nothing is copied on the worker: a request is sent gathered from its header and the caller's
/// keys and values, and a reply's values are received straight into the caller's `out` (each
/// request's reply has its own tag, and its receive is posted before the request leaves). So
/// keys, values and `out` must stay valid, and keys and values unchanged, until the request has
/// been waited for; after a failed request, `out` holds unspecified values.

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/concepts/consistency.hpp"
#include "dtrain/concepts/transport.hpp"
#include "dtrain/core/deadline.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/signature.hpp"
#include "dtrain/detail/log.hpp"
#include "dtrain/ps/configuration.hpp"
#include "dtrain/ps/heartbeat.hpp"
#include "dtrain/ps/key_cache.hpp"
#include "dtrain/ps/protocol.hpp"
#include "dtrain/ps/options.hpp"
#include "dtrain/ps/roles.hpp"
#include "dtrain/ps/sharding.hpp"
#include "dtrain/ps/stats.hpp"
#include "dtrain/ps/worker_requests.hpp"

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

  /// Joins the servers: a hello to each, answered within `options.timeout`. A server found lost
  /// meanwhile (one that died before a late worker came) is failed over when shards have copies.
  /// @throws dtrain::error `timeout` naming the servers that did not answer; `invalid_argument`
  ///   if a server was configured differently (counts, consistency model, value type).
  worker(Transport t, roles r, Sharding shards, ps_options o = {})
      : transport_(std::move(t)),
        roles_(r),
        sharding_(std::move(shards)),
        options_(o),
        dense_sharding_(r.shard_count()),
        dense_layout_(o.dense_slice_bytes, sizeof(T)) {
    if (roles_.is_server(transport_.rank())) {
      throw error(errc::invalid_argument,
                  "ps::worker on rank " + std::to_string(transport_.rank()) + ", a server rank");
    }
    if (sharding_.servers() != roles_.shard_count()) {
      throw error(errc::invalid_argument, "ps::worker: the sharding cuts the keys into " +
                                              std::to_string(sharding_.servers()) + " shards but the group has " +
                                              std::to_string(roles_.shard_count()) +
                                              " (DTRAIN_PS_SHARDS, else one per server)");
    }
    id_ = static_cast<std::uint32_t>(roles_.worker_of(transport_.rank()));
    request hello;
    for (int s = 0; s < roles_.servers; ++s) {
      hello.ids_.push_back(send(s, op::hello, table_id::sparse, config_, std::span<const T>{}, 0, nullptr));
    }
    try {
      wait(hello, deadline::after(options_.timeout));
    } catch (const error& e) {
      const std::string missing = requests_.unanswered(hello.ids_);
      throw error(code_of(e), "ps::worker " + std::to_string(id_) + ": joining the servers" +
                                  (missing.empty() ? "" : " (no answer from server " + missing + ")") + ": " +
                                  e.reason());
    }
    // Resumed servers say which clock this worker left off at; all must agree (a server lost
    // before it answered says nothing).
    const auto& clocks = requests_.hello_clocks();
    std::size_t first = clocks.size();
    for (std::size_t s = 0; s < clocks.size(); ++s) {
      if (requests_.lost(static_cast<int>(s))) continue;
      if (first == clocks.size()) first = s;
      if (clocks[s] != clocks[first]) {
        throw error(errc::bad_data, "ps::worker " + std::to_string(id_) +
                                        ": the servers resumed from different clocks (server " + std::to_string(first) +
                                        " at " + std::to_string(clocks[first]) + ", server " + std::to_string(s) +
                                        " at " + std::to_string(clocks[s]) +
                                        "); their checkpoints are from different rounds");
      }
    }
    clock_ = first == clocks.size() ? 0 : clocks[first];
    heartbeat_.emplace(transport_, roles_, options_, id_);
    if (roles_.is_late_worker(static_cast<int>(id_))) enter_running_job();
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

  /// Finishes this worker's current clock on every shard. Waiting on it blocks while the
  /// consistency model holds this worker back (BSP: until every worker finished the clock).
  request clock() {
    request r = to_every_shard(op::clock);
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
    requests_.wait(r.ids_, d);
    r.ids_.clear();
    guard.ok = true;
    stats_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  /// Says goodbye to every shard's head and waits for them to acknowledge. Idempotent.
  void finish() {
    if (finished_) return;
    finished_ = true;
    request r = to_every_shard(op::goodbye);
    // Standby servers get no goodbye unless they head a shard (it went first, on the same
    // connection): a heartbeat tells them this worker is done, so one that heads a shard later
    // does not wait for it. It goes before the goodbyes are answered: a server that ends once
    // every worker said goodbye is then the end of the job to a standby, not a loss whose place
    // it should take.
    tell_standbys_done();
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
  using destination = typename worker_requests<Transport, T>::destination;

  // A request of kind `what` carrying nothing but this worker's clock, to every shard's head.
  request to_every_shard(op what) {
    request r;
    for (int s = 0; s < roles_.shard_count(); ++s) {
      r.ids_.push_back(send(s, what, table_id::sparse, std::span<const key_type>{}, std::span<const T>{}, 0, nullptr));
    }
    return r;
  }

  // A heartbeat flagged `worker_done` to every standby server. Best effort: one that finished is
  // gone, and one that never came (a late rank) never reads it.
  void tell_standbys_done() {
    request_header done{op::heartbeat, table_id::sparse, 0, 0, 0, 0, 0, id_};
    done.flags = worker_done;
    auto standbys =
        std::views::iota(0, roles_.standby) | std::views::transform([this](int i) { return roles_.standby_rank(i); });
    send_notice(transport_, standbys, options_.tag,
                encode_request<T>(done, std::span<const key_type>{}, std::span<const T>{}), options_.timeout);
  }

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
            std::copy_n(values.data() + static_cast<std::size_t>(positions[j]) * length, length,
                        gathered.data() + j * length);
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

  // A late worker enters at a clock every shard agrees on: it asks each shard where it may
  // (each holds a clock past its rounds in progress for it), then enters at the latest one named
  // (ps/shard_replica.hpp, `on_enter`). The rounds before it complete without this worker.
  void enter_running_job() {
    clock_ = 0;  // asks
    request asked = to_every_shard(op::enter);
    wait(asked);
    clock_ = requests_.entry_clock();
    request entered = to_every_shard(op::enter);
    wait(entered);
    dtrain::detail::log(
        dtrain::detail::log_level::info,
        "ps::worker " + std::to_string(id_) + " joins the running job at clock " + std::to_string(clock_));
  }

  std::uint64_t send(int shard, op what, table_id which, std::span<const key_type> keys, std::span<const T> values,
                     std::size_t length, const destination* into, std::vector<key_type> own_keys = {},
                     std::vector<T> own_values = {}) {
    return requests_.send(shard, what, which, keys, values, length, into, clock_, std::move(own_keys),
                          std::move(own_values));
  }

  Transport transport_;
  roles roles_;
  Sharding sharding_;
  ps_options options_;
  consistent_hash_sharding dense_sharding_;
  dense_layout dense_layout_;
  std::uint32_t id_ = 0;
  std::int64_t clock_ = 0;
  // What a hello carries (as keys), checked by every server.
  const std::array<std::uint64_t, 9> config_ =
      job_configuration{roles_, Consistency::name, sizeof(T), options_.replicas}.words();
  worker_stats stats_;
  // Fail-over with more than one copy or a standby (a server leaving hands its place to one),
  // except under soft sync (its groups span clocks); under a barrier model pushes are kept until
  // their round is answered. After transport_: its receives go first.
  bool may_fail_over_ = options_.replicas > 1 || roles_.standby > 0;
  worker_requests<Transport, T> requests_{
      transport_, roles_, options_, static_cast<std::uint32_t>(roles_.worker_of(transport_.rank())),
      may_fail_over_ && !(Consistency{}.staleness_bound() != 0 && Consistency{}.pushes_to_apply(roles_.workers) > 1),
      may_fail_over_ && Consistency{}.staleness_bound() == 0, stats_};
  bool finished_ = false, broken_ = false;
  std::optional<heartbeat<Transport, T>> heartbeat_;  // last: stopped first
};

}  // namespace dtrain::ps
