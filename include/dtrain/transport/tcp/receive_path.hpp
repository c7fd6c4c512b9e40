#pragma once
// The TCP engine's receiving side: the reader thread's epoll loop, the per-connection state
// machine (header, payload into a posted receive or an unexpected buffer, discard) that whoever
// holds a connection's `reading` flag runs, and delivery of a rank's messages to itself. A CRTP part of `engine`, whose
// state it reaches through `self()`.

#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "dtrain/core/deadline.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/detail/buffer_pool.hpp"
#include "dtrain/detail/log.hpp"
#include "dtrain/transport/tcp/operation.hpp"

namespace dtrain::detail::tcp_engine {

template <class Engine>
class receive_path {
 public:
  // A connection is read by whichever thread holds its `reading` flag: the reader thread when
  // epoll reports data, or a thread waiting for a receive from that peer (so the common case
  // costs no thread hand-off). The fd is registered EPOLLONESHOT; whoever releases the flag
  // re-arms it, and level-triggered readiness then reports anything that arrived meanwhile.

  // Connections a waiter left disarmed: watch them again once idle for `lazy_idle`, unless a
  // waiter is back. Re-arming one sooner (when the reader wakes for another reason) would hand
  // the reader thread the next message of a collective still running, at the cost of a wake-up
  // and a copy, instead of the waiter that is about to come for it.
  static constexpr std::chrono::milliseconds lazy_idle{1};
  void rearm_lazy() {
    const std::int64_t now = deadline::clock::now().time_since_epoch().count();
    const std::int64_t idle = std::chrono::duration_cast<deadline::clock::duration>(lazy_idle).count();
    for (auto& c : self().conns_) {
      if (!c || !c->lazy.load(std::memory_order_acquire)) continue;
      if (c->helpers.load(std::memory_order_acquire) > 0) continue;  // it will leave it lazy again
      if (now - c->left_at.load(std::memory_order_acquire) < idle) continue;
      c->lazy.store(false, std::memory_order_release);
      self().lazy_count_.fetch_sub(1, std::memory_order_acq_rel);
      rearm(*c);
    }
  }

  // Every epoll registration: a connection's socket for reading (keyed by the connection's
  // address), a dup of it for writing (the same key with the low bit set), and two eventfds with
  // keys no aligned address takes.
  static constexpr std::uint64_t stop_key = 0;
  static constexpr std::uint64_t wake_key = 2;
  static constexpr std::uint32_t read_events = EPOLLIN | EPOLLRDHUP | EPOLLONESHOT;
  static std::uint64_t read_key(connection& c) { return reinterpret_cast<std::uintptr_t>(&c); }
  static std::uint64_t write_key(connection& c) { return read_key(c) | 1u; }

  void watch(int op, int fd, std::uint32_t events, std::uint64_t key) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = key;
    ::epoll_ctl(self().epoll_fd_, op, fd, &ev);
  }

  // HUP and ERR are reported even unasked; EPOLLONESHOT lets them through once at most.
  void disarm(connection& c) { watch(EPOLL_CTL_MOD, c.fd, EPOLLONESHOT, read_key(c)); }
  void rearm(connection& c) { watch(EPOLL_CTL_MOD, c.fd, read_events, read_key(c)); }

  void reader_loop() {
    epoll_event events[64];
    while (true) {
      // Announce a sleep without timeout before deciding on it (see wait()).
      self().reader_asleep_.store(true);
      const int timeout = self().lazy_count_.load() > 0 ? 1 : -1;
      if (timeout > 0) self().reader_asleep_.store(false);
      int n = ::epoll_wait(self().epoll_fd_, events, 64, timeout);
      self().reader_asleep_.store(false);
      if (self().lazy_count_.load() > 0) rearm_lazy();
      for (int i = 0; i < n; ++i) {
        const std::uint64_t key = events[i].data.u64;
        if (key == stop_key) return;
        if (key == wake_key) {
          std::uint64_t count = 0;
          [[maybe_unused]] auto got = ::read(self().wake_fd_, &count, sizeof count);
          continue;
        }
        auto& c = *reinterpret_cast<connection*>(key & ~std::uint64_t{1});
        if (key & 1u) {  // the write side: room in the socket again
          {
            // Only a parked writer's turn is taken over; HUP and ERR arrive unasked.
            std::lock_guard lock(self().m_);
            if (!c.write_parked) continue;
            c.write_parked = false;
          }
          self().pump(c);
          continue;
        }
        if (c.helpers.load(std::memory_order_acquire) > 0) continue;  // a waiter reads; it re-arms
        drain(c, true);
      }
    }
  }

  // Reads whatever the socket holds and acts on it. @returns false if another thread is reading.
  bool drain(connection& c, bool by_reader = false) {
    if (c.reading.exchange(true, std::memory_order_acquire)) return false;
    const std::uint64_t first_frame = c.rx_seq;
    auto count = [&] {
      if (by_reader) self().frames_by_reader_.fetch_add(c.rx_seq - first_frame, std::memory_order_relaxed);
    };
    while (true) {
      iovec iov[max_message_parts + 1];
      const int parts = target_iov(c, iov);
      if (parts < 0) {  // closed
        count();
        c.reading.store(false, std::memory_order_release);
        return false;
      }
      if (c.ahead_begin < c.ahead_end) {  // bytes already read come first
        accept(c, copy_ahead(c, iov, parts));
        continue;
      }
      iov[parts] = {c.rx_ahead.data(), c.rx_ahead.size()};
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<decltype(msg.msg_iovlen)>(parts + 1);
      ssize_t got = ::recvmsg(c.fd, &msg, MSG_DONTWAIT);
      if (got > 0) {
        std::size_t wanted = 0;
        for (int i = 0; i < parts; ++i) wanted += iov[i].iov_len;
        const auto n = static_cast<std::size_t>(got);
        c.ahead_begin = 0;
        c.ahead_end = n > wanted ? n - wanted : 0;
        accept(c, std::min(n, wanted));
        continue;
      }
      if (got < 0 && errno == EINTR) continue;
      if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      std::string why = got == 0 ? "closed the connection without saying goodbye (process exited or was killed)"
                                 : "connection error: " + std::string(std::strerror(errno));
      fail_reception(c, "was lost mid-message");
      stop_reading(c);
      count();
      c.reading.store(false, std::memory_order_release);
      read_failed(c, why);
      return false;
    }
    count();
    c.reading.store(false, std::memory_order_release);
    if (c.helpers.load(std::memory_order_acquire) == 0) rearm(c);
    return true;
  }

  // Where the current frame part's next bytes go. @returns how many iovecs, or -1 when closed.
  int target_iov(connection& c, iovec* iov) {
    switch (c.rx_phase) {
      case rx_state::header:
        iov[0] = {c.rx_header.data() + c.rx_have, frame_header::size - c.rx_have};
        return 1;
      case rx_state::payload:
        return remaining_iov(c.rx_parts.view(), c.rx_done, c.rx_left, iov);
      case rx_state::discard:
        c.rx_scratch.resize(1 << 16);
        iov[0] = {c.rx_scratch.data(), std::min<std::size_t>(c.rx_left, c.rx_scratch.size())};
        return 1;
      case rx_state::closed:
        break;
    }
    return -1;
  }

  // Copies read-ahead bytes into `iov`. @returns how many.
  static std::size_t copy_ahead(connection& c, const iovec* iov, int parts) noexcept {
    std::size_t n = 0;
    for (int i = 0; i < parts && c.ahead_begin < c.ahead_end; ++i) {
      const std::size_t take = std::min(iov[i].iov_len, c.ahead_end - c.ahead_begin);
      std::memcpy(iov[i].iov_base, c.rx_ahead.data() + c.ahead_begin, take);
      c.ahead_begin += take;
      n += take;
      if (take < iov[i].iov_len) break;
    }
    return n;
  }

  // `n` bytes of the current frame part have arrived: move the state machine on.
  void accept(connection& c, std::size_t n) {
    if (c.rx_phase == rx_state::header) {
      c.rx_have += n;
      if (c.rx_have == frame_header::size) {
        c.rx_have = 0;
        on_header(c);
      }
      return;
    }
    if (c.rx_phase == rx_state::payload) c.rx_done += n;
    c.rx_left -= n;
    if (c.rx_left == 0) finish_payload(c);
  }

  void on_header(connection& c) {
    auto r = decode_frame(c.rx_header, c.rx_seq, self().settings_.max_frame_bytes);
    if (!r.ok) {
      log(log_level::error, "rank " + std::to_string(self().rank_) + " closing the connection to rank " +
                                std::to_string(c.peer) + ": malformed frame: " + r.error);
      stop_reading(c);
      self().connection_failed(c, errc::protocol_error, "sent a malformed frame (" + r.error + ")");
      return;
    }
    ++c.rx_seq;
    c.rx_frame = r.header;
    const frame_header& h = c.rx_frame;
    switch (h.kind) {
      case frame_kind::data: return on_data(c, h);
      case frame_kind::goodbye: on_goodbye(c); break;
      case frame_kind::goodbye_ack: {
        std::lock_guard lock(self().m_);
        c.goodbye_acked = true;
        self().state_cv_.notify_all();
        break;
      }
      case frame_kind::remote:
      case frame_kind::remote_done:
        stop_reading(c);
        self().connection_failed(c, errc::protocol_error, "sent a shared-memory frame over TCP");
        return;
      case frame_kind::abort:
        if (h.length > max_abort_reason_bytes) {
          stop_reading(c);
          self().connection_failed(c, errc::protocol_error, "sent an abort frame longer than " +
                                                                std::to_string(max_abort_reason_bytes) + " bytes");
          return;
        }
        c.rx_text.resize(h.length);
        return expect_payload(c, receive_parts(std::span<std::byte>(c.rx_text)), h.length);
    }
    expect_discard(c, h.length);
  }

  // Nothing more is read from `c`; waiting threads see it through `rx_closed`.
  static void stop_reading(connection& c) {
    c.rx_phase = rx_state::closed;
    c.rx_closed.store(true, std::memory_order_release);
  }

  void expect_payload(connection& c, const receive_parts& into, std::size_t len) {
    c.rx_parts = into;
    c.rx_done = 0;
    c.rx_left = len;
    c.rx_phase = rx_state::payload;
    if (len == 0) finish_payload(c);
  }

  // Fills `iov` with the bytes of `ranges` after the first `skip`, at most `limit` of them: where
  // a partly done read or write goes on. @returns how many iovecs.
  template <class Byte>
  static int remaining_iov(std::span<const std::span<Byte>> ranges, std::size_t skip, std::size_t limit,
                           iovec* iov) noexcept {
    int n = 0;
    for (auto r : ranges) {
      if (limit == 0) break;
      if (skip >= r.size()) {
        skip -= r.size();
        continue;
      }
      const std::size_t take = std::min(r.size() - skip, limit);
      iov[n++] = {const_cast<std::byte*>(r.data()) + skip, take};
      skip = 0;
      limit -= take;
    }
    return n;
  }

  void expect_discard(connection& c, std::uint64_t len) {
    c.rx_left = static_cast<std::size_t>(len);
    c.rx_phase = len == 0 ? rx_state::header : rx_state::discard;
    if (len == 0) finish_payload(c);
  }

  void on_data(connection& c, const frame_header& h) {
    const auto len = static_cast<std::size_t>(h.length);
    std::unique_lock lock(self().m_);
    if (op_ptr recv = self().queue_.take_receive({c.peer, h.tag})) {
      recv->state = operation::phase::active;
      lock.unlock();
      recv->env.peer = c.peer;
      recv->env.sig = h.sig;
      recv->env.bytes = len;
      c.rx_recv = recv;
      const landing into = land(recv->buffer, recv->grow, len);
      if (!into.truncated) return expect_payload(c, into.parts, len);
      c.rx_truncated = true;  // too large for the posted buffer: consume it, report truncation
      return expect_discard(c, len);
    }
    auto in = std::make_shared<incoming>();
    in->peer = c.peer;
    in->tag = h.tag;
    in->sig = h.sig;
    in->length = len;
    hold_payload(*in);
    self().queue_.hold(in);
    lock.unlock();
    c.rx_in = in;
    expect_payload(c, receive_parts(std::span<std::byte>(in->data.get(), len)), len);
  }

  // The payload (or discarded bytes) of the current frame are in: complete what waited on it.
  void finish_payload(connection& c) {
    c.rx_phase = rx_state::header;
    if (op_ptr recv = std::move(c.rx_recv)) {
      bool truncated = std::exchange(c.rx_truncated, false);
      recv->complete(truncated ? make_error_code(errc::message_truncated) : std::error_code{});
      return;
    }
    if (incoming_ptr in = std::move(c.rx_in)) {
      std::unique_lock lock(self().m_);
      in->complete = true;
      op_ptr claimant = std::move(in->claimed);
      lock.unlock();
      if (claimant) deliver(*in, *claimant);
      return;
    }
    if (c.rx_frame.kind == frame_kind::abort && !c.rx_text.empty()) {
      const std::string text = abort_reason(c.rx_text);
      c.rx_text.clear();
      self().group_failed(rank_text(c.peer) + " aborted the group: " + text, c.peer, false,
                          abort_code(c.rx_frame.tag));
    }
  }

  // The connection broke mid-frame: whoever waited on this frame fails.
  // Once the group has failed, its first cause is what they report.
  void fail_reception(connection& c, const std::string& what) {
    std::pair<errc, std::string> why{errc::peer_lost, rank_text(c.peer) + " " + what};
    op_ptr claimant;
    {
      std::lock_guard lock(self().m_);
      if (self().failed_) why = self().ended(c);
      if (c.rx_in) {
        // Out of the queue too, or a receive posted before the connection's failure is recorded
        // would claim a message that never completes, and wait past its deadline.
        claimant = std::move(c.rx_in->claimed);
        self().queue_.withdraw_message(c.rx_in);
      }
    }
    c.rx_in.reset();
    if (op_ptr recv = std::move(c.rx_recv)) recv->complete(make_error_code(why.first), why.second);
    if (claimant) claimant->complete(make_error_code(why.first), why.second);
  }

  void read_failed(connection& c, const std::string& why) {
    {
      std::lock_guard lock(self().m_);
      // After the peer's goodbye (it sent everything it will send) or during our own shutdown,
      // the end of the connection is expected, whether it comes as EOF or as a reset.
      if (c.departed || self().stopping_ || !c.open) {
        c.open = false;
        self().state_cv_.notify_all();
        return;
      }
    }
    self().connection_failed(c, errc::peer_lost, why);
  }

  void on_goodbye(connection& c) {
    std::vector<op_ptr> orphans;
    std::string why;
    {
      std::lock_guard lock(self().m_);
      c.departed = true;
      // Everything the peer sent came before its goodbye; receives still waiting on it never
      // will be satisfied.
      orphans = self().queue_.take_receives_from(c.peer);
      why = self().departure_text(c);  // reads c.lost, which the lock guards
    }
    for (auto& r : orphans) r->complete(make_error_code(errc::peer_lost), why);
    auto ack = std::make_shared<operation>();
    ack->is_send = true;
    ack->kind = frame_kind::goodbye_ack;
    ack->env.peer = c.peer;
    self().enqueue(c, ack);
  }

  // A message to this rank: straight into a posted receive, or held until one is posted.
  void send_to_self(const op_ptr& op) {
    std::unique_lock lock(self().m_);
    if (op_ptr recv = self().queue_.take_receive({self().rank_, op->env.tag})) {
      recv->state = operation::phase::active;
      lock.unlock();
      incoming in;
      in.peer = self().rank_;
      in.tag = op->env.tag;
      in.sig = op->env.sig;
      in.length = op->data.bytes();
      copy_into(in, op->data, *recv);
      op->complete({});
      return;
    }
    auto in = std::make_shared<incoming>();
    in->peer = self().rank_;
    in->tag = op->env.tag;
    in->sig = op->env.sig;
    in->length = op->data.bytes();
    hold_payload(*in);
    scatter_copy(op->data, receive_parts(std::span<std::byte>(in->data.get(), in->length)));
    in->complete = true;
    self().queue_.hold(std::move(in));
    lock.unlock();
    op->complete({});
  }

  // Copies an early message into its receive and keeps its buffer for the next one, before the
  // receive completes (whose waiter may then end the engine).
  void deliver(incoming& in, operation& recv) {
    const bool fits = fill(in, send_parts(std::span<const std::byte>(in.data.get(), in.length)), recv);
    self().early_buffers_.give({std::move(in.data), in.capacity});
    recv.complete(fits ? std::error_code{} : make_error_code(errc::message_truncated));
  }

  // Room for an early message's payload, from the buffers earlier ones left.
  void hold_payload(incoming& in) {
    auto b = self().early_buffers_.take(in.length);
    in.data = std::move(b.data);
    in.capacity = b.capacity;
  }

  static void copy_into(const incoming& in, const send_parts& from, operation& recv) {
    const bool fits = fill(in, from, recv);
    recv.complete(fits ? std::error_code{} : make_error_code(errc::message_truncated));
  }

  // The message's envelope and bytes into `recv`. @returns whether they fit.
  static bool fill(const incoming& in, const send_parts& from, operation& recv) {
    recv.env.peer = in.peer;
    recv.env.sig = in.sig;
    recv.env.bytes = in.length;
    return copy_message(from, recv.buffer, recv.grow);
  }

 private:
  Engine& self() noexcept { return static_cast<Engine&>(*this); }
  const Engine& self() const noexcept { return static_cast<const Engine&>(*this); }
};

}  // namespace dtrain::detail::tcp_engine
