#pragma once
/// @file
/// Point-to-point messages of Thrust-device buffers over a host transport, staged through pinned
/// host memory: what `staged_communicator::isend` and `irecv` return, and the pool of pinned
/// blocks they stage through.
///
/// A send copies its buffer out to a pinned block when it starts (the only wait: a local copy),
/// then hands the block to the transport; a receive lands in a pinned block and is copied into the
/// caller's buffer when it is waited for (or tested finished). Sends and receives progress
/// independently, as the transport's do: a receive posted before its send, a ring where every rank
/// receives first, many messages in flight all complete. Each message carries its element type and
/// count; a receive of another type or size fails with `errc::collective_mismatch` naming both.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "dtrain/concepts/completion.hpp"
#include "dtrain/concepts/transport.hpp"
#include "dtrain/core/deadline.hpp"
#include "dtrain/core/element.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/signature.hpp"
#include "dtrain/cuda/thrust_space.hpp"
#include "dtrain/flight/recorded.hpp"

namespace dtrain {

template <transport Transport>
class staged_communicator;

namespace detail::staging {

// Pinned blocks kept between messages: allocating page-locked memory costs milliseconds under
// CUDA. A block goes back to the pool when the message that holds it is finished with.
class pinned_pool : public std::enable_shared_from_this<pinned_pool> {
  using block = thrust_space::pinned<std::byte>;

 public:
  // A block of at least `n` bytes, owned until destroyed.
  class lease {
   public:
    lease() = default;
    lease(lease&& o) noexcept
        : pool_(std::move(o.pool_)), block_(std::move(o.block_)), n_(std::exchange(o.n_, 0)) {}
    lease& operator=(lease&& o) noexcept {
      std::swap(pool_, o.pool_);
      std::swap(block_, o.block_);
      std::swap(n_, o.n_);
      return *this;
    }
    ~lease() {
      if (pool_) pool_->give_back(std::move(block_));
    }
    std::span<std::byte> bytes() noexcept { return block_.span().first(n_); }

   private:
    friend class pinned_pool;
    lease(std::shared_ptr<pinned_pool> pool, block b, std::size_t n)
        : pool_(std::move(pool)), block_(std::move(b)), n_(n) {}
    std::shared_ptr<pinned_pool> pool_;
    block block_;
    std::size_t n_ = 0;
  };

  lease take(std::size_t n) {
    std::unique_lock lock(m_);
    auto fits = std::find_if(free_.begin(), free_.end(), [n](const block& b) { return b.size() >= n; });
    if (fits == free_.end()) {
      lock.unlock();
      return lease(shared_from_this(), block(n), n);
    }
    block b = std::move(*fits);
    free_.erase(fits);
    return lease(shared_from_this(), std::move(b), n);
  }

 private:
  static constexpr std::size_t kept = 16;

  void give_back(block b) noexcept {
    if (b.size() == 0) return;
    std::lock_guard lock(m_);
    if (free_.size() >= kept) return;  // `b` is freed here
    auto at = std::lower_bound(free_.begin(), free_.end(), b.size(),
                               [](const block& x, std::size_t s) { return x.size() < s; });
    free_.insert(at, std::move(b));  // smallest first: `take` picks the tightest fit
  }

  std::mutex m_;
  std::vector<block> free_;
};

// What every staged message of one communicator shares: the pool and the stream its copies run on
// (apart from the collectives' stream, so messages may run beside collectives on another thread).
struct p2p_state {
  explicit p2p_state(flight::p2p_log l) : log(std::move(l)) {}
  std::shared_ptr<pinned_pool> pool = std::make_shared<pinned_pool>();
  thrust_space::owned_stream stream = thrust_space::ordered_with_default();
  flight::p2p_log log;  // the flight recorder's record of the messages
};

}  // namespace detail::staging

/// A staged point-to-point send or receive (a `completion`). A receive's bytes reach the
/// caller's device buffer when `wait` succeeds or `test` returns true. A `wait` that times out
/// leaves it pending (a later `wait` may succeed); destroying an unfinished one cancels it. As a
/// transport's requests, it is finished or destroyed before its communicator.
template <completion Request>
class staged_request {
 public:
  staged_request() = default;
  staged_request(staged_request&& o) noexcept { *this = std::move(o); }
  /// A moved-from handle is finished and empty, as a default-constructed one.
  staged_request& operator=(staged_request&& o) noexcept {
    if (this == &o) return *this;
    if (!settled_) cancel();
    request_ = std::move(o.request_);  // before the block: the transport lets go of ours first
    block_ = std::move(o.block_);
    state_ = std::move(o.state_);
    destination_ = o.destination_;
    want_ = o.want_;
    rank_ = o.rank_, peer_ = o.peer_;
    tag_ = o.tag_;
    receive_ = std::exchange(o.receive_, false);
    settled_ = std::exchange(o.settled_, true);
    result_ = std::exchange(o.result_, {});
    return *this;
  }

  bool wait(deadline d, std::error_code& ec) noexcept {
    if (!settled_) {
      std::error_code got;
      if (!request_.wait(d, got) && got == errc::timeout) {
        ec = got;
        return false;  // still pending: a later wait may succeed
      }
      settle(got);
    }
    ec = result_;
    return !result_;
  }

  /// @throws dtrain::error naming this rank, the peer, the user's tag and, for a receive of the
  /// wrong type or size, what was expected and what arrived.
  void wait(deadline d) {
    std::error_code ec;
    if (wait(d, ec)) return;
    std::string text = std::string("staged ") + (receive_ ? "receive from" : "send to") + " rank " +
                       std::to_string(peer_) + " (tag " + std::to_string(tag_) + ") at rank " + std::to_string(rank_);
    if (ec == errc::collective_mismatch) {
      text += ": expected " + describe_message(want_) + ", the sender sent " + describe_message(request_.info().sig);
    }
    throw error(ec, text);
  }

  bool test() noexcept {
    if (settled_) return true;
    if (!request_.test()) return false;
    std::error_code ec;
    request_.wait(deadline::after(std::chrono::milliseconds(0)), ec);
    settle(ec);
    return true;
  }

  /// Withdraws the operation; a receive whose message had already arrived still lands (its
  /// `wait` succeeds), as the transport completes an operation it was copying.
  void cancel() noexcept {
    if (settled_) return;
    request_.cancel();
    std::error_code ec;
    request_.wait(deadline::after(std::chrono::milliseconds(0)), ec);
    settle(ec == errc::timeout ? make_error_code(errc::cancelled) : ec);
  }

  const envelope& info() const noexcept { return request_.info(); }

 private:
  template <transport>
  friend class staged_communicator;

  // Finishes the operation once the transport's part has ended with `ec`: a receive's signature
  // is checked and its bytes copied into the caller's buffer.
  bool settle(std::error_code ec) noexcept {
    settled_ = true;
    if (receive_ && (!ec || ec == errc::message_truncated)) {
      const signature& got = request_.info().sig;
      if (ec || got.type != want_.type || got.count != want_.count) {
        ec = make_error_code(errc::collective_mismatch);
      } else {
        try {
          const std::span<const std::byte> bytes = block_.bytes();
          detail::thrust_space::upload<std::byte>(destination_, bytes, state_->stream.get());
        } catch (const std::exception&) {
          ec = make_error_code(errc::device_error);
        }
      }
    }
    result_ = ec;
    return !ec;
  }

  static std::string describe_message(const signature& s) {
    return std::to_string(s.count) + " " + std::string(dtype_name(s.type));
  }

  std::shared_ptr<detail::staging::p2p_state> state_;
  detail::staging::pinned_pool::lease block_;  // before request_: the transport lets go of it first
  Request request_{};
  thrust_buffer<std::byte> destination_{};     // a receive's device buffer
  signature want_{};                           // what a receive expects
  int rank_ = 0, peer_ = 0;
  std::uint64_t tag_ = 0;
  bool receive_ = false, settled_ = true;  // a default or moved-from handle is finished
  std::error_code result_{};
};

}  // namespace dtrain
