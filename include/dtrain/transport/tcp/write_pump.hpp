#pragma once
// The TCP engine's sending side: one writer per connection at a time, non-blocking gathered
// `sendmsg` from the calling thread, and a parked writer that the reader thread resumes once the
// socket drains. A CRTP part of `engine`, whose state it reaches through `self()`.

#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/detail/log.hpp"
#include "dtrain/transport/tcp/operation.hpp"

namespace dtrain::detail::tcp_engine {

template <class Engine>
class write_pump {
 public:
  void enqueue(connection& c, const op_ptr& op) {
    {
      std::lock_guard lock(self().m_);
      if (!c.open || (self().failed_ && op->kind == frame_kind::data)) {
        const auto [code, why] = self().ended(c);
        op->complete(make_error_code(code), why);
        return;
      }
      if (c.departed && op->kind == frame_kind::data) {
        op->complete(make_error_code(errc::peer_lost), self().departure_text(c));
        return;
      }
      c.sendq.push_back(op);
      if (c.writing || c.pending) return;  // a late rank's queue is written once it connects
      c.writing = true;
    }
    pump(c);
  }

  // Writes queued frames while the socket takes them. Called by the one writer (the thread that
  // set `writing`); hands over to the I/O thread when the socket is full.
  void pump(connection& c) {
    while (true) {
      op_ptr op;
      {
        std::lock_guard lock(self().m_);
        if (c.sendq.empty() || !c.open) {
          c.writing = false;
          if (!c.open) self().fail_queue(c);
          return;
        }
        op = c.sendq.front();
        if (op->state == operation::phase::queued) {
          frame_header h;
          h.kind = op->kind;
          h.tag = op->env.tag;
          h.seq = c.tx_seq++;
          if (op->kind != frame_kind::data) op->data = send_parts(std::as_bytes(std::span(op->owned)));
          h.length = op->data.bytes();
          h.sig = op->env.sig;
          op->header = encode_frame(h);
          op->state = operation::phase::active;
        }
      }
      while (op->written < op->total()) {
        // The frame header, then the payload's parts, from where the last write stopped.
        std::array<std::span<const std::byte>, 1 + max_message_parts> frame{std::span<const std::byte>(op->header)};
        std::ranges::copy(op->data.view(), frame.begin() + 1);
        iovec iov[1 + max_message_parts];
        const int n =
            self().remaining_iov(std::span<const std::span<const std::byte>>(frame.data(), 1 + op->data.count()),
                                 op->written, op->total() - op->written, iov);
        msghdr msg{};
        msg.msg_iov = iov;
        msg.msg_iovlen = static_cast<decltype(msg.msg_iovlen)>(n);
        ssize_t sent = ::sendmsg(c.fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (sent > 0) {
          op->written += static_cast<std::size_t>(sent);
          continue;
        }
        if (sent < 0 && errno == EINTR) continue;
        if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
          wait_writable(c);
          return;
        }
        const int err = errno;
        const std::string lost = "write failed: " + std::string(std::strerror(err));
        std::pair<errc, std::string> why{errc::peer_lost, lost};
        {
          std::lock_guard lock(self().m_);
          c.sendq.pop_front();
          c.writing = false;
          if (self().failed_ || !c.open) why = self().ended(c);  // the first cause, not its aftermath
        }
        op->complete(make_error_code(why.first), why.second);
        self().connection_failed(c, errc::peer_lost, lost);
        return;
      }
      {
        std::lock_guard lock(self().m_);
        c.sendq.pop_front();
      }
      op->complete({});
    }
  }

  // The socket is full: the writer's turn passes to the reader thread, which resumes the pump
  // when the socket drains (level-triggered, so space freed in between is never missed). The
  // write side has its own registration, on a dup of the socket, so it never disturbs reading.
  void wait_writable(connection& c) {
    {
      std::lock_guard lock(self().m_);
      c.write_parked = true;
    }
    self().watch(EPOLL_CTL_MOD, c.wfd, EPOLLOUT | EPOLLONESHOT, self().write_key(c));
  }

 private:
  Engine& self() noexcept { return static_cast<Engine&>(*this); }
  const Engine& self() const noexcept { return static_cast<const Engine&>(*this); }
};

}  // namespace dtrain::detail::tcp_engine
