#pragma once
/// @file
/// `inproc_transport`: the ranks of a group are threads of one process.
///
/// For fast tests and single-machine use. A message is copied once, straight from the sender's
/// buffer into the receiver's: a send that finds its receive posted copies at once; otherwise it
/// waits in the receiver's mailbox until the receive is posted, and the receiver copies.

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "dtrain/concepts/completion.hpp"
#include "dtrain/core/deadline.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/memory_space.hpp"
#include "dtrain/core/signature.hpp"
#include "dtrain/detail/match_queue.hpp"
#include "dtrain/detail/message_parts.hpp"
#include "dtrain/detail/request_error.hpp"
#include "dtrain/transport/buffer_forms.hpp"
#include "dtrain/transport/progress.hpp"
#include "dtrain/transport/request.hpp"

namespace dtrain {

namespace detail::inproc {

// One send or receive. Its phase moves queued -> copying -> done; `queued` and `copying` change
// under the owning mailbox's lock, `done` under the operation's own lock.
struct operation {
  enum class phase { queued, copying, done };

  bool is_send = false;
  int self = 0;            // the rank that started it
  int mailbox = 0;         // the mailbox it is queued in (the receiver's)
  envelope env;            // peer = the other side (or any_peer), tag, signature, size
  send_parts data;                         // send payload, gathered
  receive_parts buffer;                    // receive: where a message that fits goes
  std::vector<std::byte>* grow = nullptr;  // receive: where a larger one goes

  phase state = phase::queued;  // guarded by the mailbox lock until done
  completion_flag flag;
  std::error_code ec;  // written before flag.set()
  std::string detail;  // unused in-process: the error code says it all

  // Called once, by whoever moved the operation to `done` under the mailbox lock.
  void complete(std::error_code code) {
    ec = code;
    flag.set();
  }
};

using operation_ptr = std::shared_ptr<operation>;

// A receive wants (peer, tag); a send waiting in its receiver's mailbox came from its sender.
struct match_keys {
  static match_key of_receive(const operation_ptr& r) noexcept { return {r->env.peer, r->env.tag}; }
  static match_key of_message(const operation_ptr& s) noexcept { return {s->self, s->env.tag}; }
};

struct mailbox {
  std::mutex m;
  // Receives of this rank waiting for a send, and sends to this rank waiting for a receive.
  match_queue<operation_ptr, operation_ptr, match_keys> queue;
  bool closed = false;  // the owner left the group
};

// Copies a matched send into a matched receive and completes both. Runs outside any mailbox lock.
inline void deliver(operation& send, operation& recv) {
  recv.env.peer = send.self;
  recv.env.sig = send.env.sig;
  recv.env.bytes = send.data.bytes();
  const bool fits = copy_message(send.data, recv.buffer, recv.grow);
  recv.complete(fits ? std::error_code{} : make_error_code(errc::message_truncated));
  send.complete({});
}

class fabric {
 public:
  explicit fabric(int size)
      : boxes_(static_cast<std::size_t>(size)),
        left_(std::make_unique<std::atomic<bool>[]>(static_cast<std::size_t>(size))) {
    for (auto& b : boxes_) b = std::make_unique<mailbox>();
  }

  int size() const noexcept { return static_cast<int>(boxes_.size()); }

  operation_ptr send(int self, int peer, std::uint64_t tag, const signature& sig, gather_list parts) {
    auto op = std::make_shared<operation>();
    op->is_send = true;
    op->self = self;
    op->mailbox = peer;
    op->data = send_parts(parts);
    op->env = envelope{peer, tag, sig, op->data.bytes()};
    mailbox& box = *boxes_[static_cast<std::size_t>(peer)];
    std::unique_lock lock(box.m);
    if (box.closed) {
      lock.unlock();
      op->state = operation::phase::done;
      op->complete(make_error_code(errc::peer_lost));
      return op;
    }
    operation_ptr recv = box.queue.take_receive({self, tag});
    if (!recv) {
      box.queue.hold(op);
      return op;
    }
    recv->state = operation::phase::copying;
    op->state = operation::phase::copying;
    lock.unlock();
    deliver(*op, *recv);
    return op;
  }

  operation_ptr receive(int self, int peer, std::uint64_t tag, scatter_list parts, std::vector<std::byte>* grow) {
    auto op = std::make_shared<operation>();
    op->self = self;
    op->mailbox = self;
    op->env = envelope{peer, tag, signature{}, 0};
    op->buffer = receive_parts(parts);
    op->grow = grow;
    mailbox& box = *boxes_[static_cast<std::size_t>(self)];
    std::unique_lock lock(box.m);
    if (operation_ptr send = box.queue.take_message({peer, tag})) {
      send->state = operation::phase::copying;
      op->state = operation::phase::copying;
      lock.unlock();
      deliver(*send, *op);
      return op;
    }
    // leave() raises the flag before it scans this mailbox under its lock, so a receive either
    // sees the flag here or is found and failed by that scan.
    if (peer != any_peer && left_[static_cast<std::size_t>(peer)].load()) {
      lock.unlock();
      op->state = operation::phase::done;
      op->complete(make_error_code(errc::peer_lost));
      return op;
    }
    box.queue.post(op);
    return op;
  }

  // Withdraws a queued operation; waits out one that is being copied.
  void cancel(const operation_ptr& op) noexcept {
    mailbox& box = *boxes_[static_cast<std::size_t>(op->mailbox)];
    {
      std::lock_guard lock(box.m);
      if (op->state == operation::phase::queued) {
        if (op->is_send) {
          box.queue.withdraw_message(op);
        } else {
          box.queue.withdraw_receive(op);
        }
        op->state = operation::phase::done;
        op->complete(make_error_code(errc::cancelled));
        return;
      }
    }
    while (!op->flag.block_until(deadline::after(std::chrono::seconds(1)))) {
    }
  }

  // Completion handles wait on the operation's flag: another rank's thread completes it.
  bool wait(const operation_ptr& op, deadline d, std::chrono::microseconds spin) noexcept {
    return op->flag.wait(d, spin);
  }

  // Rank `self` leaves: everything that needed it fails with peer_lost.
  void leave(int self) noexcept {
    left_[static_cast<std::size_t>(self)].store(true);
    std::vector<operation_ptr> failed;
    // `state` is guarded by the mailbox lock, so it is set before the lock is released.
    auto take = [&failed](operation_ptr op) {
      op->state = operation::phase::done;
      failed.push_back(std::move(op));
    };
    for (std::size_t b = 0; b < boxes_.size(); ++b) {
      mailbox& box = *boxes_[b];
      std::lock_guard lock(box.m);
      if (static_cast<int>(b) == self) {
        box.closed = true;
        for (auto& s : box.queue.take_all_messages()) take(std::move(s));
        for (auto& r : box.queue.take_all_receives()) take(std::move(r));
        continue;
      }
      for (auto& r : box.queue.take_receives_from(self)) take(std::move(r));
    }
    for (auto& op : failed) op->complete(make_error_code(errc::peer_lost));
  }

 private:
  std::vector<std::unique_ptr<mailbox>> boxes_;
  std::unique_ptr<std::atomic<bool>[]> left_;  // per rank: it left the group
};

}  // namespace detail::inproc

/// The completion handle of an in-process send or receive (a model of `completion`).
using inproc_request = transport_request<detail::inproc::fabric, detail::inproc::operation>;

/// One rank's endpoint of an in-process group (a model of `transport`). Move-only: the endpoint
/// is the rank's membership, and destroying it leaves the group, which fails every operation
/// that still needs this rank with `errc::peer_lost`.
class inproc_transport : public transport_buffer_forms<inproc_transport> {
 public:
  using transport_buffer_forms::irecv;
  using transport_buffer_forms::isend;
  using memory_space = host_memory;
  using request = inproc_request;

  inproc_transport(std::shared_ptr<detail::inproc::fabric> f, int rank) noexcept
      : fabric_(std::move(f)), rank_(rank) {}
  inproc_transport(inproc_transport&& other) noexcept
      : fabric_(std::move(other.fabric_)), rank_(other.rank_) {}
  inproc_transport& operator=(inproc_transport&& other) noexcept {
    if (this != &other) {
      leave();
      fabric_ = std::move(other.fabric_);
      rank_ = other.rank_;
    }
    return *this;
  }
  ~inproc_transport() { leave(); }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return fabric_ ? fabric_->size() : 0; }

  /// Starts sending the bytes of `parts` as one message (copied straight into the receive).
  /// @pre 0 <= peer < size(), parts.size() <= max_message_parts
  request isend(int peer, std::uint64_t tag, const signature& sig, gather_list parts) {
    DTRAIN_ASSERT(peer >= 0 && peer < size(), "send to a rank outside the group");
    return {fabric_, fabric_->send(rank_, peer, tag, sig, parts)};
  }

  /// Starts receiving from `peer` (or `any_peer`) on `tag` into `parts`, or whole into
  /// `*overflow` if larger (see the `transport` concept).
  request irecv(int peer, std::uint64_t tag, scatter_list parts, std::vector<std::byte>* overflow) {
    DTRAIN_ASSERT(peer == any_peer || (peer >= 0 && peer < size()),
                  "receive from a rank outside the group");
    return {fabric_, fabric_->receive(rank_, peer, tag, parts, overflow)};
  }

  /// Leaves the group now (the destructor does this too).
  void leave() noexcept {
    if (fabric_) fabric_->leave(rank_);
    fabric_.reset();
  }

 private:
  std::shared_ptr<detail::inproc::fabric> fabric_;
  int rank_ = 0;
};

/// Creates the `size` endpoints of one in-process group; hand endpoint r to the thread of rank r.
/// @pre size >= 1
inline std::vector<inproc_transport> make_inproc_group(int size) {
  DTRAIN_ASSERT(size >= 1, "a group needs at least one rank");
  auto f = std::make_shared<detail::inproc::fabric>(size);
  std::vector<inproc_transport> ranks;
  ranks.reserve(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) ranks.emplace_back(f, r);
  return ranks;
}

/// Runs `body(rank, endpoint)` for every rank of a new in-process group, each on its own thread,
/// and returns when all have finished. If any rank throws, the first exception is rethrown here
/// (after every thread has been joined); a rank that throws leaves the group as its endpoint is
/// destroyed, so the others fail with `errc::peer_lost` instead of waiting for their deadlines.
/// @pre size >= 1
template <class Body>
void run_inproc(int size, Body&& body) {
  auto endpoints = make_inproc_group(size);
  std::exception_ptr first;
  std::mutex m;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r, t = std::move(endpoints[static_cast<std::size_t>(r)])]() mutable {
      try {
        body(r, std::move(t));
      } catch (...) {
        std::lock_guard lock(m);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace dtrain
