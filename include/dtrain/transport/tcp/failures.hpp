#pragma once
// How the TCP engine fails: a broken connection fails what waited on it (and, by default, the
// whole group, telling every other rank why with an `abort` frame); a failed group or a stopped
// engine fails everything still pending. A CRTP part of `engine`, whose state it reaches through
// `self()`.

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
class failures {
 public:
  // Fails everything queued on `c` except the frame a writer owns (it fails that itself).
  // Requires the engine lock.
  void fail_queue(connection& c) {
    std::deque<op_ptr> q;
    if (c.writing && !c.sendq.empty()) {
      q.assign(c.sendq.begin() + 1, c.sendq.end());
      c.sendq.erase(c.sendq.begin() + 1, c.sendq.end());
    } else {
      q.swap(c.sendq);
    }
    const auto [code, why] = ended(c);
    for (auto& op : q) op->complete(make_error_code(code), why);
  }

  // Why an operation on `c` cannot complete: the group's failure once there is one (the first
  // cause, which a later loss, such as the peer exiting once told of it, must not hide), else
  // `c`'s departure. Requires the engine lock.
  std::pair<errc, std::string> ended(const connection& c) const {
    if (self().failed_) return {self().failure_code_, self().failure_};
    return {errc::peer_lost, departure_text(c)};
  }

  void connection_failed(connection& c, errc code, const std::string& why) {
    std::vector<op_ptr> orphans;
    bool abort = false;
    {
      std::lock_guard lock(self().m_);
      if (!c.open) return;
      c.open = false;
      c.lost = rank_text(c.peer) + " " + why;
      (void)code;
      for (auto& r : self().queue_.take_receives_from(c.peer)) orphans.push_back(std::move(r));
      fail_queue(c);
      // Half-read messages from this peer will never complete.
      self().queue_.take_messages_if([&](const incoming_ptr& in) { return in->peer == c.peer && !in->complete; });
      // The group's failure is recorded before anyone wakes, so what they read is complete.
      abort = self().settings_.abort_group_on_peer_loss && !self().stopping_ && !self().failed_;
      if (abort) {
        self().failed_ = true;
        self().failure_ = c.lost;
      }
      self().state_cv_.notify_all();
    }
    for (auto& r : orphans) r->complete(make_error_code(errc::peer_lost), c.lost);
    // shutdown, not close: a writer may still hold the descriptor, which must not be reused
    // under it. The socket is closed when the engine stops.
    ::shutdown(c.fd, SHUT_RDWR);
    if (abort) group_failed(c.lost, c.peer, true);
  }

  // The group cannot go on: fail every waiting receive with `code`, and tell the other peers
  // why, so that ranks that never talked to the lost one fail at once too, naming it. Returns
  // the abort frames it queued.
  std::vector<op_ptr> group_failed(const std::string& why, int source, bool marked = false,
                                   errc code = errc::peer_lost) {
    std::vector<op_ptr> orphans, aborts;
    std::vector<connection*> others;
    {
      std::lock_guard lock(self().m_);
      if (self().failed_ && !marked) return aborts;
      self().failed_ = true;
      self().failure_ = why;
      self().failure_code_ = code;
      orphans = self().queue_.take_all_receives();
      for (auto& c : self().conns_) {
        if (c && c->open && c->peer != source && !c->departed && !c->pending) others.push_back(c.get());
      }
    }
    log(log_level::warn, "rank " + std::to_string(self().rank_) + ": group failed: " + why);
    for (auto& r : orphans) r->complete(make_error_code(code), why);
    for (connection* c : others) {
      auto abort = std::make_shared<operation>();
      abort->is_send = true;
      abort->kind = frame_kind::abort;
      abort->env.peer = c->peer;
      abort->env.tag = abort_tag(code);
      abort->owned = "rank " + std::to_string(self().rank_) + " reports: " + why;
      if (abort->owned.size() > 4000) abort->owned.resize(4000);
      self().enqueue(*c, abort);
      aborts.push_back(std::move(abort));
    }
    return aborts;
  }

  void fail_everything(std::error_code ec, const std::string& why) {
    std::vector<op_ptr> orphans;
    {
      std::lock_guard lock(self().m_);
      orphans = self().queue_.take_all_receives();
      for (auto& c : self().conns_) {
        if (!c) continue;
        for (auto& op : c->sendq) orphans.push_back(op);
        c->sendq.clear();
        c->writing = false;
        c->open = false;
      }
    }
    for (auto& op : orphans) {
      if (!op->flag.done()) op->complete(ec, why);
    }
  }

  std::string departure_text(const connection& c) const {
    if (!c.lost.empty()) return c.lost;
    if (c.departed) return rank_text(c.peer) + " has shut down its transport";
    return rank_text(c.peer) + " is not connected";
  }

 private:
  Engine& self() noexcept { return static_cast<Engine&>(*this); }
  const Engine& self() const noexcept { return static_cast<const Engine&>(*this); }
};

}  // namespace dtrain::detail::tcp_engine
