#pragma once
// The shared-memory engine: one rank's end of every ring and who moves the bytes (what a pass
// over the rings does is protocol.hpp).
//
// No thread is needed to move bytes: a caller that waits drives progress itself (writes what
// its sends still hold into the peers' rings, reads what its own rings hold into the posted
// receives), spinning first if its progress policy says so, then sleeping on its inbox's bell,
// which a peer rings after writing data for it or freeing room in a ring it writes. A progress
// thread does the same while no caller waits (a send's tail still moves while the sender
// computes), and watches the peers' processes: one that exits without its goodbye frame fails
// the group within a few milliseconds, naming it.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "dtrain/concepts/transport.hpp"
#include "dtrain/core/deadline.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/frame.hpp"
#include "dtrain/transport/byte_operation.hpp"
#include "dtrain/transport/progress.hpp"
#include "dtrain/transport/shm/protocol.hpp"
#include "dtrain/transport/shm/segment.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace dtrain::detail::shm {

class engine : protected protocol {
 public:
  engine(int rank, int size, settings s, segment own, std::vector<segment> inboxes, const std::vector<int>& pids)
      : protocol(rank, size, std::move(s), std::move(own), std::move(inboxes), pids) {}
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;
  ~engine() { stop(); }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  /// Whether this host has two cores for each rank of the group (progress.hpp).
  bool spare_cores() const noexcept { return spare_cores_; }

  void start() {
    thread_ = std::thread([this] { progress_thread(); });
  }

  byte_op_ptr send(int peer, std::uint64_t tag, const signature& sig, gather_list parts,
                   frame_kind kind = frame_kind::data) {
    auto op = std::make_shared<byte_operation>();
    op->is_send = true;
    op->kind = kind;
    op->data = send_parts(parts);
    op->env = envelope{peer, tag, sig, op->data.bytes()};
    std::lock_guard lock(m_);
    if (!failure_.empty()) {
      op->complete(make_error_code(failure_code_), failure_);
    } else if (peer == rank_) {
      send_to_self(op);
    } else if (at(peer).departed || at(peer).lost) {
      op->complete(make_error_code(errc::peer_lost), left_text(peer));
    } else if (op->data.bytes() > settings_.options.max_message_bytes) {
      op->complete(make_error_code(errc::invalid_argument), "a message of " + std::to_string(op->data.bytes()) +
                                                                " bytes exceeds the maximum of " +
                                                                std::to_string(settings_.options.max_message_bytes));
    } else {
      at(peer).sendq.push_back(op);
    }
    progress_locked(unexpected::leave);
    return op;
  }

  byte_op_ptr receive(int peer, std::uint64_t tag, scatter_list parts, std::vector<std::byte>* grow,
                      std::shared_ptr<std::atomic<bool>> claim = nullptr) {
    auto op = std::make_shared<byte_operation>();
    op->claim = std::move(claim);
    op->env = envelope{peer, tag, signature{}, 0};
    op->buffer = receive_parts(parts);
    op->grow = grow;
    std::lock_guard lock(m_);
    // A message already taken from the ring came before any still in it.
    if (early_message_ptr m = queue_.find_message({peer, tag}); m && !byte_match_keys::claim(op)) {
      byte_match_keys::drop(op);  // its twin in the other transport was served
    } else if (m) {
      queue_.withdraw_message(m);
      deliver(*m, *op);
    } else if (!failure_.empty()) {
      op->complete(make_error_code(failure_code_), failure_);
    } else if (peer != any_peer && peer != rank_ && (at(peer).departed || at(peer).lost)) {
      op->complete(make_error_code(errc::peer_lost), left_text(peer));
    } else {
      queue_.post(op);
    }
    progress_locked(unexpected::leave);  // the message may wait in a ring
    return op;
  }

  /// Drives progress until `op` completes or `d` passes. @returns whether it completed.
  bool wait(const byte_op_ptr& op, deadline d, std::chrono::microseconds spin) noexcept {
    if (op->flag.done()) return true;
    drivers_.fetch_add(1);
    // The spin lasts `spin` past the last step forward: a message streaming through a ring
    // keeps its waiter awake, an idle peer does not.
    auto spin_until = deadline::clock::now() + spin;
    std::uint64_t seen_moves = moves_.load(std::memory_order_relaxed);
    bool done = false;
    for (unsigned turn = 1;; ++turn) {
      try_progress(unexpected::leave);
      if ((done = op->flag.done())) break;
      if (turn % clock_turns != 0) {  // reading the clock costs more than a pass over idle rings
        pause();
        continue;
      }
      const auto now = deadline::clock::now();
      if (now >= d.time()) break;
      if (const std::uint64_t m = moves_.load(std::memory_order_relaxed); m != seen_moves) {
        seen_moves = m;
        spin_until = now + spin;
      }
      if (now < spin_until) {
        pause();
        continue;
      }
      const std::uint32_t seen = self_->bell.load(std::memory_order_acquire);
      try_progress(unexpected::leave);  // after reading the bell: anything newer changes it, and the sleep returns
      if ((done = op->flag.done())) break;
      sleep_on_bell(seen, std::min(std::chrono::duration_cast<std::chrono::microseconds>(d.time() - now),
                                   std::chrono::microseconds(watch_period)));
    }
    drivers_.fetch_sub(1);
    return done;
  }

  /// Withdraws a receive not yet matched or a send not yet started; lets any other finish.
  void cancel(const byte_op_ptr& op) noexcept {
    {
      std::lock_guard lock(m_);
      if (op->state == byte_operation::phase::queued) {
        const bool removed = op->is_send ? std::erase(at(op->env.peer).sendq, op) > 0 : queue_.withdraw_receive(op);
        if (removed) {
          op->complete(make_error_code(errc::cancelled));
          return;
        }
      }
    }
    while (!wait(op, deadline::after(settings_.options.linger), std::chrono::microseconds(0))) {
      std::lock_guard lock(m_);
      fail_group(errc::cancelled, "an operation could not be withdrawn within the linger time");
    }
  }

  /// Writes `bytes` into the ring to `peer` as they are, unframed: for the fault tests.
  void write_raw_for_testing(int peer, std::span<const std::byte> bytes) {
    std::lock_guard lock(m_);
    link& l = at(peer);
    while (!bytes.empty()) {
      const std::size_t n = std::min(bytes.size(), l.out.room());
      l.out.put(bytes.data(), n);
      l.out.publish();
      ring(l.peer);
      bytes = bytes.subspan(n);
    }
  }

  /// What this rank has sent by each path, and where single copy fell back to the ring.
  shm_stats stats() const {
    std::lock_guard lock(m_);
    shm_stats s = sent_;
    s.fallbacks = settings_.fallbacks;
    return s;
  }

  /// Why the group failed; empty while it is healthy.
  std::string failure() const {
    std::lock_guard lock(m_);
    return failure_;
  }

  /// Fails the group here and on every peer, telling each why (an abort frame: their waiting
  /// operations fail with `code`, naming this rank and `why`), once the frames are in the rings
  /// or the linger time has passed.
  void abort(const std::string& why, errc code = errc::peer_lost) noexcept {
    try {
      std::string text = rank_text(rank_) + " reports: " + why;
      text.resize(std::min(text.size(), max_abort_reason_bytes));
      const std::span<const std::byte> parts[] = {std::as_bytes(std::span(text))};
      std::vector<byte_op_ptr> frames;
      for (int p = 0; p < size_; ++p) {
        if (p != rank_) frames.push_back(send(p, abort_tag(code), signature{}, gather_list(parts), frame_kind::abort));
      }
      const deadline d = deadline::after(settings_.options.linger);
      for (auto& f : frames) wait(f, d, std::chrono::microseconds(0));
      std::lock_guard lock(m_);
      fail_group(code, why);  // (fails a frame still queued: `text` goes away)
    } catch (...) {  // out of memory: the peers see this rank leave instead
    }
  }

  /// Leaves the group: says goodbye after everything sent (waiting up to the linger time for
  /// the rings to take it), closes the inbox to writers and stops the progress thread.
  void stop() noexcept {
    if (stopped_.exchange(true)) return;
    std::vector<byte_op_ptr> goodbyes;
    for (int p = 0; p < size_; ++p) {
      if (p != rank_) goodbyes.push_back(send(p, 0, signature{}, gather_list{}, frame_kind::goodbye));
    }
    const deadline d = deadline::after(settings_.options.linger);
    for (auto& g : goodbyes) wait(g, d, std::chrono::microseconds(0));
    // Peers may still have to read what this rank's remote frames left in its memory.
    drivers_.fetch_add(1);
    while (!d.expired()) {
      const std::uint32_t seen = self_->bell.load(std::memory_order_acquire);
      try_progress(unexpected::leave);
      if (!awaiting_reads()) break;
      sleep_on_bell(seen, watch_period);
    }
    drivers_.fetch_sub(1);
    self_->closed.store(1, std::memory_order_release);
    {
      std::lock_guard lock(m_);
      if (failure_.empty()) fail_group(errc::peer_lost, rank_text(rank_) + " (this rank) has left the group");
    }
    quit_.store(true);
    self_->bell.fetch_add(1);
    futex_wake(&self_->bell);  // the progress thread may sleep without counting itself a sleeper
    if (thread_.joinable()) thread_.join();
  }

 private:
  // While spinning: a pause, or, with more ranks on the host than cores, the core itself, so
  // the peer this rank waits for can run (Open MPI's yield-when-idle on oversubscription).
  void pause() const noexcept {
    if (oversubscribed_) {
      std::this_thread::yield();
      return;
    }
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
  }

  bool awaiting_reads() const {
    std::lock_guard lock(m_);
    return failure_.empty() &&
           std::any_of(links_.begin(), links_.end(), [](const link& l) { return !l.awaiting.empty(); });
  }

  void sleep_on_bell(std::uint32_t seen, std::chrono::microseconds timeout) noexcept {
    self_->sleepers.fetch_add(1, std::memory_order_seq_cst);
    futex_wait(&self_->bell, seen, timeout);
    self_->sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }

  // Runs a pass unless another thread is running one. @returns whether an operation waits on a peer.
  bool try_progress(unexpected policy) noexcept {
    if (!m_.try_lock()) return true;
    progress_locked(policy);
    const bool pending = has_pending();
    m_.unlock();
    return pending;
  }

  // Moves bytes for operations posted by callers that do not wait (a send's tail while its
  // caller computes), and watches the peers. It takes no message nobody asked for, and asks
  // peers to wake it only while an operation is pending and no caller drives: a wake-up on a
  // core a waiter or a peer needs costs more than the bytes it moves.
  void progress_thread() noexcept {
    while (!quit_.load()) {
      const std::uint32_t seen = self_->bell.load(std::memory_order_acquire);
      if (drivers_.load() != 0) {
        std::this_thread::sleep_for(watch_period);  // the waiters move the bytes; watch the peers
        try_progress(unexpected::leave);
      } else if (try_progress(unexpected::leave)) {
        sleep_on_bell(seen, watch_period);
      } else {
        futex_wait(&self_->bell, seen, watch_period);  // not counted a sleeper: nobody rings for it
      }
    }
  }

  // One pass over every ring; a corrupt ring fails the group. Runs under m_.
  void progress_locked(unexpected policy) noexcept {
    try {
      for (int p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        pump_out(p);
        pump_in(p, policy);
      }
    } catch (const error& e) {
      fail_group(static_cast<errc>(e.code().value()), e.reason());
    } catch (const std::bad_alloc&) {
      fail_group(errc::invalid_argument, "dtrain: out of memory holding a message that came before its receive");
    }
    if (const auto now = deadline::clock::now(); now >= next_watch_) {
      next_watch_ = now + watch_period;
      watch_peers();
    }
    wake_local_waiters();
  }

  // Another thread of this rank may be asleep waiting for what this one completed.
  void wake_local_waiters() noexcept {
    if (completed_ && self_->sleepers.load() != 0) ring(self_);
    completed_ = false;
  }

  mutable std::mutex m_;  // guards the protocol's state and next_watch_
  deadline::clock::time_point next_watch_{};

  static constexpr unsigned clock_turns = 16;  // spins between reads of the clock
  const bool oversubscribed_ = more_ranks_than_cores(size_);
  const bool spare_cores_ = spare_cores_for(size_);  // every rank of the group is on this host
  std::atomic<int> drivers_{0};  // callers in wait(), moving bytes themselves
  std::atomic<bool> quit_{false};
  std::atomic<bool> stopped_{false};
  std::thread thread_;
};

}  // namespace dtrain::detail::shm
