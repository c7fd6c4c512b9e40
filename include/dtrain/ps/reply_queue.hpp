#pragma once
/// @file
/// `ps::reply_queue`: a server's replies in flight. Each goes out on the tag of the request it
/// answers (`reply_tag`, from the id in its header) and its bytes live until the send completes.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <system_error>
#include <utility>

#include "dtrain/concepts/transport.hpp"
#include "dtrain/core/deadline.hpp"
#include "dtrain/core/signature.hpp"
#include "dtrain/ps/protocol.hpp"

namespace dtrain::ps {

template <transport Transport>
class reply_queue {
 public:
  explicit reply_queue(std::uint64_t request_tag) noexcept : tag_(request_tag) {}

  /// Sends `bytes` (an encoded response) to rank `to` over `t`. @returns the bytes sent.
  std::size_t send(Transport& t, int to, message bytes) {
    const std::uint64_t id = dtrain::detail::wire::get<std::uint64_t>(bytes.data() + 8);
    return send_on(t, to, reply_tag(tag_, id), std::move(bytes));
  }

  /// Sends a request of this server's own to server `to` (a standby asking to join a chain).
  std::size_t send_request(Transport& t, int to, message bytes) { return send_on(t, to, tag_, std::move(bytes)); }

  /// Forgets the replies that have left, oldest first.
  void reap() {
    while (!sends_.empty() && sends_.front().handle->test()) sends_.pop_front();
  }

  /// Waits until every reply has left or `d` passes; a worker that left takes its replies with it.
  void flush(deadline d) noexcept { wait_all_sent(sends_, d); }

 private:
  std::size_t send_on(Transport& t, int to, std::uint64_t tag, message bytes) {
    const std::size_t size = bytes.size();
    sends_.emplace_back(std::move(bytes));
    auto& s = sends_.back();
    s.handle.emplace(t.isend(to, tag, signature{}, s.bytes.bytes()));
    return size;
  }

  using send_handle = decltype(std::declval<Transport&>().isend(0, 0, signature{}, std::span<const std::byte>{}));

  std::uint64_t tag_;
  std::deque<outgoing_message<send_handle>> sends_;
};

}  // namespace dtrain::ps
