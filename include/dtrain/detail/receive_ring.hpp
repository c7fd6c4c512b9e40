#pragma once
// Receives from one source (a peer, or any peer) kept posted a fixed number deep and taken in the
// order they were posted. A message that arrives while the previous one is still being handled
// lands in a buffer of its own; with a single posted receive it would go to the transport's
// unexpected queue instead, costing an allocation and a copy each time the sender pipelines its
// messages.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <system_error>
#include <thread>
#include <vector>

#include "dtrain/core/deadline.hpp"

namespace dtrain::detail {

template <class Transport>
class receive_ring {
 public:
  using handle = decltype(std::declval<Transport&>().irecv(0, 0, std::declval<std::vector<std::byte>&>()));

  receive_ring() = default;
  // The transport holds the buffers' addresses while receives are posted.
  receive_ring(const receive_ring&) = delete;
  receive_ring& operator=(const receive_ring&) = delete;

  /// Posts `slots` (at least one) receives for messages from `peer` (or any peer) on `tag`.
  void start(Transport& transport, int peer, std::uint64_t tag, std::size_t slots) {
    transport_ = &transport;
    peer_ = peer;
    tag_ = tag;
    // Sized once: the posted receives hold the buffers' addresses.
    buffers_ = std::vector<std::vector<std::byte>>(std::max<std::size_t>(slots, 1));
    receives_ = std::vector<std::optional<handle>>(buffers_.size());
    for (std::size_t slot = 0; slot < buffers_.size(); ++slot) post(slot);
  }

  /// The receive the next message completes.
  handle& current() { return *receives_[next_]; }
  /// Its buffer, once `current()` has completed.
  const std::vector<std::byte>& message() const { return buffers_[next_]; }

  /// Waits for `current()`: looks for `spin` first (yielding between looks), then sleeps up to
  /// `sleep`. Messages come in bursts (a worker's push, clock and pull), so a short look saves a
  /// wake-up per message of a burst. @returns whether it completed; `ec` says why not, or is
  /// `timeout` when `sleep` passed
  bool wait_current(std::chrono::microseconds spin, std::chrono::milliseconds sleep, std::error_code& ec) {
    handle& r = current();
    bool got = false;
    for (const auto end = std::chrono::steady_clock::now() + spin; !got && std::chrono::steady_clock::now() < end;) {
      got = r.test();
      if (!got) std::this_thread::yield();
    }
    if (got) return r.wait(deadline::after(std::chrono::milliseconds(0)), ec);  // collects the status
    return r.wait(deadline::after(sleep), ec);
  }

  /// Takes the current message's buffer, leaving `spare` in its slot (posted on `advance`): for
  /// a caller that passes the message on without copying it.
  std::vector<std::byte> take_message(std::vector<std::byte> spare) {
    std::swap(buffers_[next_], spare);
    return spare;
  }

  /// The current message is handled: its slot is posted again, behind the others. The buffer
  /// keeps its size, so a message of the same size costs no zero-filling.
  void advance() {
    post(next_);
    next_ = (next_ + 1) % buffers_.size();
  }

  void cancel() noexcept {
    for (auto& r : receives_) {
      if (r) r->cancel();
    }
  }

 private:
  void post(std::size_t slot) { receives_[slot].emplace(transport_->irecv(peer_, tag_, buffers_[slot])); }

  Transport* transport_ = nullptr;
  int peer_ = 0;
  std::uint64_t tag_ = 0;
  std::vector<std::vector<std::byte>> buffers_;
  std::vector<std::optional<handle>> receives_;
  std::size_t next_ = 0;
};

}  // namespace dtrain::detail
