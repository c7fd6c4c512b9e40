#pragma once
// The TCP engine's connection set-up: the accept loop with its handshake and admission rules
// (only higher ranks connect, same group size and epoch, one connection per peer), connecting to
// the lower ranks with retries until the deadline, and adopting each socket into the engine
// (out of Asio, non-blocking, registered with the reader's epoll). A CRTP part of `engine`,
// whose state it reaches through `self()`; it runs on the I/O thread except where it waits.

#include <utility>  // before Asio (Boost 1.74)

#include <boost/asio.hpp>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>

#include "dtrain/core/deadline.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/detail/backoff.hpp"
#include "dtrain/detail/log.hpp"
#include "dtrain/net/handshake.hpp"
#include "dtrain/transport/tcp/operation.hpp"

namespace dtrain::detail::tcp_engine {

// Whether two socket addresses are one host's: the same address, or both loopback.
inline bool same_host(const sockaddr_storage& a, const sockaddr_storage& b) noexcept {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    const auto& x = reinterpret_cast<const sockaddr_in&>(a).sin_addr;
    const auto& y = reinterpret_cast<const sockaddr_in&>(b).sin_addr;
    const auto loopback = [](in_addr v) { return (ntohl(v.s_addr) >> 24) == 127; };
    return x.s_addr == y.s_addr || (loopback(x) && loopback(y));
  }
  if (a.ss_family == AF_INET6) {
    const auto& x = reinterpret_cast<const sockaddr_in6&>(a).sin6_addr;
    const auto& y = reinterpret_cast<const sockaddr_in6&>(b).sin6_addr;
    return std::memcmp(&x, &y, sizeof x) == 0 || (IN6_IS_ADDR_LOOPBACK(&x) && IN6_IS_ADDR_LOOPBACK(&y));
  }
  return false;
}

// Whether socket `fd`'s two ends are on one host.
inline bool same_host(int fd) noexcept {
  sockaddr_storage mine{}, theirs{};
  socklen_t a = sizeof mine, b = sizeof theirs;
  return ::getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &a) == 0 &&
         ::getpeername(fd, reinterpret_cast<sockaddr*>(&theirs), &b) == 0 && same_host(mine, theirs);
}

template <class Engine>
class connector {
 public:
  /// Connects to `peer` at host:port, retrying with backoff until `d`. @throws dtrain::error
  void connect_to(int peer, const std::string& host, std::uint16_t port, deadline d) {
    std::error_code ec;
    std::string why;
    auto result = retry_with_backoff(d, std::chrono::milliseconds(1000), [&] {
      if (try_connect(peer, host, port, d, ec, why)) return attempt::done;
      // Refused by the peer (wrong token, wrong group): retrying cannot help.
      return ec == errc::peer_lost || ec == errc::timeout ? attempt::retry : attempt::give_up;
    });
    if (result == attempt::done) return;
    std::string where = " rank " + std::to_string(peer) + " at " + host + ":" + std::to_string(port);
    if (result == attempt::give_up) {
      throw error(ec, "dtrain: rank " + std::to_string(self().rank_) + " connecting to" + where + ": " + why);
    }
    throw error(errc::timeout, "dtrain: rank " + std::to_string(self().rank_) + " could not connect to" + where +
                                   " before the deadline (last error: " + why + ")");
  }

  /// Connects to `peer` as a late rank joining a running group: the group's ranks have been
  /// listening since it formed, so one that refuses the connection, or does not answer within
  /// a few seconds, is gone, and counts as lost (its operations fail naming it) instead of
  /// failing the join.
  void connect_late(int peer, const std::string& host, std::uint16_t port, deadline d) {
    std::error_code ec;
    std::string why;
    const deadline soon = deadline::after(std::min(std::chrono::duration_cast<std::chrono::milliseconds>(d.remaining()),
                                                   std::chrono::milliseconds(3000)));
    bool gone = false;
    auto result = retry_with_backoff(soon, std::chrono::milliseconds(200), [&] {
      if (try_connect(peer, host, port, soon, ec, why)) return attempt::done;
      gone = ec == errc::peer_lost;  // refused or reset: nobody listens there any more
      return ec == errc::timeout ? attempt::retry : attempt::give_up;
    });
    if (result == attempt::done) return;
    if (result == attempt::give_up && !gone) {
      throw error(ec, "dtrain: rank " + std::to_string(self().rank_) + " joining late, connecting to rank " +
                          std::to_string(peer) + " at " + host + ":" + std::to_string(port) + ": " + why);
    }
    auto c = std::make_unique<connection>(peer, -1);
    c->open = false;
    c->connected.store(false, std::memory_order_relaxed);
    c->lost = "rank " + std::to_string(peer) + " did not answer rank " + std::to_string(self().rank_) +
              " joining the group late (" + why + "): it is gone";
    log(log_level::warn, c->lost);
    std::lock_guard lock(self().m_);
    self().conns_[static_cast<std::size_t>(peer)] = std::move(c);
  }

  /// This rank and the peers whose connection's two ends share an address (or are both
  /// loopback): the group's ranks on this host, as far as its connections tell. Called once the
  /// group formed.
  int ranks_here() {
    std::lock_guard lock(self().m_);
    int here = 1;
    for (const auto& c : self().conns_) {
      if (c && c->fd >= 0 && same_host(c->fd)) ++here;
    }
    return here;
  }

  /// Waits until every rank above this one has connected (late ranks connect when they come).
  /// @throws dtrain::error naming the ranks still missing.
  void wait_for_accepts(deadline d, std::chrono::milliseconds timeout) {
    std::unique_lock lock(self().m_);
    const int last = self().size_ - self().settings_.late_ranks;
    auto missing_rank = [&](int p) {
      const auto& c = self().conns_[static_cast<std::size_t>(p)];
      return !c || c->pending;
    };
    auto all_in = [&] {
      for (int p = self().rank_ + 1; p < last; ++p) {
        if (missing_rank(p)) return false;
      }
      return true;
    };
    if (self().accept_cv_.wait_until(lock, d.time(), all_in)) return;
    std::string missing;
    for (int p = self().rank_ + 1; p < last; ++p) {
      if (missing_rank(p)) missing += (missing.empty() ? "" : ", ") + std::to_string(p);
    }
    throw error(errc::timeout, "dtrain: rank " + std::to_string(self().rank_) + " timed out after " +
                                   std::to_string(timeout.count()) + " ms waiting for rank(s) " +
                                   missing + " to connect (epoch " + std::to_string(self().settings_.epoch) + ")");
  }

  /// The group is connected; incoming connections are no longer admitted (unless late ranks
  /// may still come).
  void close_listener() {
    if (self().settings_.late_ranks > 0) return;
    asio::post(self().io_, [this] {
      boost::system::error_code ignored;
      self().acceptor_.close(ignored);
    });
  }

 protected:
  void accept_next() {
    self().acceptor_.async_accept([this](boost::system::error_code ec, tcp::socket s) {
      if (ec) {
        if (ec != asio::error::operation_aborted && self().acceptor_.is_open()) accept_next();
        return;
      }
      auto sock = std::make_shared<tcp::socket>(std::move(s));
      std::string from = endpoint_text(*sock);
      handshake::accept(
          *sock, self().settings_.token, self().settings_.handshake_timeout,
          [this](const auth::hello& h) { return admit(h); },
          [this, sock, from](std::error_code hec, std::string why, const auth::hello& h) {
            if (hec) {
              log(log_level::warn, "rank " + std::to_string(self().rank_) + " refused a connection from " +
                                       from + ": " + why);
              boost::system::error_code ignored;
              sock->close(ignored);
              return;
            }
            log(log_level::debug, "rank " + std::to_string(self().rank_) + " accepted rank " +
                                      std::to_string(h.rank) + " from " + from);
            adopt(h.rank, std::move(*sock));
          });
      accept_next();
    });
  }

  std::string admit(const auth::hello& h) {
    if (h.who != auth::role::transport) return "this port serves a transport, not a store";
    if (h.world != self().size_) {
      return "group size " + std::to_string(h.world) + " where this group has " + std::to_string(self().size_);
    }
    if (h.epoch != self().settings_.epoch) {
      return "epoch " + std::to_string(h.epoch) + " where this group is at epoch " +
             std::to_string(self().settings_.epoch);
    }
    if (h.rank <= self().rank_ || h.rank >= self().size_) {
      return "rank " + std::to_string(h.rank) + " cannot connect to rank " + std::to_string(self().rank_) +
             " (only higher ranks connect)";
    }
    std::lock_guard lock(self().m_);
    if (const auto& c = self().conns_[static_cast<std::size_t>(h.rank)]; c && !c->pending) {
      return "rank " + std::to_string(h.rank) + " is already connected";
    }
    return {};
  }

  bool try_connect(int peer, const std::string& host, std::uint16_t port, deadline d,
                   std::error_code& ec, std::string& why) {
    auto sock = std::make_shared<tcp::socket>(self().io_);
    auto result = std::make_shared<std::promise<std::pair<std::error_code, std::string>>>();
    auto future = result->get_future();
    auto resolver = std::make_shared<tcp::resolver>(self().io_);
    auth::hello mine;
    mine.who = auth::role::transport;
    mine.rank = self().rank_;
    mine.world = self().size_;
    mine.epoch = self().settings_.epoch;
    auto timeout = std::min(self().settings_.handshake_timeout,
                            std::chrono::duration_cast<std::chrono::milliseconds>(d.remaining()) +
                                std::chrono::milliseconds(1));
    asio::post(self().io_, [=, this] {
      resolver->async_resolve(
          host, std::to_string(port),
          [=, this](boost::system::error_code rec, tcp::resolver::results_type eps) {
            if (rec) {
              result->set_value({make_error_code(errc::peer_lost), "cannot resolve " + host + ": " + rec.message()});
              return;
            }
            asio::async_connect(*sock, eps, [=, this](boost::system::error_code cec, const tcp::endpoint&) {
              if (cec) {
                result->set_value({make_error_code(errc::peer_lost), cec.message()});
                return;
              }
              handshake::connect(*sock, self().settings_.token, timeout, mine,
                                 [=](std::error_code hec, std::string text, const auth::hello&) {
                                   result->set_value({hec, std::move(text)});
                                 });
            });
          });
    });
    // 50 ms past the deadline, so that the handshake's own timeout answers first
    if (future.wait_until(d.later(std::chrono::milliseconds(50)).time()) != std::future_status::ready) {
      asio::post(self().io_, [sock, resolver] {
        boost::system::error_code ignored;
        resolver->cancel();
        sock->close(ignored);
      });
      future.wait();  // closing the socket ends whichever step was pending
      ec = make_error_code(errc::timeout);
      why = "no answer before the deadline";
      return false;
    }
    auto [hec, text] = future.get();
    if (hec) {
      ec = hec;
      why = text;
      asio::post(self().io_, [sock] {
        boost::system::error_code ignored;
        sock->close(ignored);
      });
      return false;
    }
    std::promise<void> adopted;
    asio::post(self().io_, [&, this] {
      adopt(peer, std::move(*sock));
      adopted.set_value();
    });
    adopted.get_future().wait();
    return true;
  }

  // Runs on the I/O thread: the connection joins the group and its reader starts.
  void adopt(int peer, tcp::socket s) {
    tune_socket(s, self().settings_.socket_buffer_bytes);
    // The descriptor leaves Asio: its reactor watches every socket it owns (edge-triggered), so
    // each burst of arriving data would also wake the I/O thread, which has nothing to do with it.
    boost::system::error_code ec;
    const int fd = s.release(ec);
    if (ec) {  // the peer then counts as missing when the group forms, and is named there
      log(log_level::error, "rank " + std::to_string(self().rank_) + " could not take over its socket to rank " +
                                std::to_string(peer) + ": " + ec.message());
      return;
    }
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    if (adopt_late(peer, fd)) return;
    auto c = std::make_unique<connection>(peer, fd);
    // Registered before it is published: a sender that finds the socket full at once parks on
    // the write registration, which must already exist.
    c->wfd = ::dup(c->fd);
    self().watch(EPOLL_CTL_ADD, c->fd, Engine::read_events, Engine::read_key(*c));
    self().watch(EPOLL_CTL_ADD, c->wfd, EPOLLONESHOT, Engine::write_key(*c));  // armed by wait_writable
    {
      std::lock_guard lock(self().m_);
      self().conns_[static_cast<std::size_t>(peer)] = std::move(c);
    }
    self().accept_cv_.notify_all();
  }

  // A late rank connecting to the connection that waited for it: it takes the socket, and what
  // was sent to it meanwhile is written now. @returns false when no connection waited.
  bool adopt_late(int peer, int fd) {
    connection* c = nullptr;
    bool write = false;
    {
      std::lock_guard lock(self().m_);
      c = self().conns_[static_cast<std::size_t>(peer)].get();
      if (c == nullptr || !c->pending) return false;
      c->fd = fd;
      c->wfd = ::dup(fd);
      self().watch(EPOLL_CTL_ADD, c->fd, Engine::read_events, Engine::read_key(*c));
      self().watch(EPOLL_CTL_ADD, c->wfd, EPOLLONESHOT, Engine::write_key(*c));
      c->pending = false;
      c->connected.store(true, std::memory_order_release);
      write = !c->sendq.empty() && !c->writing;
      if (write) c->writing = true;
    }
    log(log_level::info,
        "rank " + std::to_string(self().rank_) + ": late rank " + std::to_string(peer) + " joined the group");
    if (write) self().pump(*c);
    self().accept_cv_.notify_all();
    return true;
  }

 private:
  Engine& self() noexcept { return static_cast<Engine&>(*this); }
};

}  // namespace dtrain::detail::tcp_engine
