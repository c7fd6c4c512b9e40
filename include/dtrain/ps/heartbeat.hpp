#pragma once
/// @file
/// `ps::heartbeat`: the thread that tells every server (standby servers too) a worker is alive, every
/// `ps_options::heartbeat_interval`, while the worker computes. A server that hears nothing from
/// a worker for `heartbeat_timeout` declares it dead (ps/worker_clocks.hpp). Heartbeats get no
/// reply; their sends are reaped as they complete and cancelled when the thread stops.

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <span>
#include <stop_token>
#include <thread>
#include <utility>

#include "dtrain/concepts/sharding.hpp"
#include "dtrain/concepts/transport.hpp"
#include "dtrain/core/signature.hpp"
#include "dtrain/ps/options.hpp"
#include "dtrain/ps/protocol.hpp"
#include "dtrain/ps/roles.hpp"

namespace dtrain::ps {

/// Sends worker `worker`'s heartbeats over `transport` (shared with the worker's own requests)
/// from construction until destruction.
template <transport Transport, class T>
class heartbeat {
 public:
  heartbeat(Transport& transport, const roles& r, const ps_options& o, std::uint32_t worker)
      : transport_(transport), roles_(r), options_(o), worker_(worker),
        thread_([this](std::stop_token stop) { beat(stop); }) {}
  heartbeat(const heartbeat&) = delete;
  heartbeat& operator=(const heartbeat&) = delete;

 private:
  using send_handle = decltype(std::declval<Transport&>().isend(0, 0, signature{}, std::span<const std::byte>{}));

  void beat(std::stop_token stop) {
    std::deque<std::pair<message, send_handle>> sent;
    std::unique_lock lock(mutex_);
    // Wakes at once when the jthread's destructor asks it to stop.
    while (!wake_.wait_for(lock, stop, options_.heartbeat_interval, [&] { return stop.stop_requested(); })) {
      for (int rank = 0; rank < roles_.size(); ++rank) {  // the servers and the standby servers
        if (!roles_.is_server(rank)) continue;
        const request_header h{op::heartbeat, table_id::sparse, 0, 0, 0, 0, 0, worker_};
        message bytes = encode_request<T>(h, std::span<const key_type>{}, std::span<const T>{});
        const auto span = bytes.bytes();
        sent.emplace_back(std::move(bytes), transport_.isend(rank, options_.tag, signature{}, span));
      }
      while (!sent.empty() && sent.front().second.test()) sent.pop_front();
    }
    for (auto& [bytes, handle] : sent) handle.cancel();
  }

  Transport& transport_;
  const roles roles_;
  const ps_options options_;
  const std::uint32_t worker_;
  std::mutex mutex_;
  std::condition_variable_any wake_;
  std::jthread thread_;  // last: starts once everything above exists, stops and joins first
};

}  // namespace dtrain::ps
