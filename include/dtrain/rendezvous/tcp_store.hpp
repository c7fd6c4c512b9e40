#pragma once
/// @file
/// `tcp_store_server` and `tcp_store`: the rendezvous store over TCP, served by rank 0 (or by a
/// launcher such as dtrain-run) and authenticated with the job token like every dtrain
/// connection.
///
/// Wire, after the handshake: a request is a 16-byte header (op u8, 3 zero bytes, key length
/// u32, argument u64: value length for set, timeout in ms for get, delta for add), the key, then
/// the value for set. A response is a 16-byte header (status u8: 0 ok, 1 timeout, 2 refused;
/// 7 zero bytes; u64: value length for get, the new value for add) and the value for get.

#include <utility>  // before Asio (Boost 1.74)

#include <boost/asio.hpp>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/core/frame.hpp"
#include "dtrain/detail/backoff.hpp"
#include "dtrain/detail/log.hpp"
#include "dtrain/net/auth.hpp"
#include "dtrain/net/handshake.hpp"
#include "dtrain/rendezvous/store.hpp"

namespace dtrain {

namespace detail::store_wire {

enum class op : std::uint8_t { set = 1, get = 2, add = 3 };
enum class status : std::uint8_t { ok = 0, timeout = 1, refused = 2 };

using header = std::array<std::byte, 16>;

struct request {
  op what = op::get;
  std::uint32_t key_length = 0;
  std::uint64_t arg = 0;
};

inline header encode(const request& r) {
  header h{};
  wire::put(&h[0], static_cast<std::uint8_t>(r.what));
  wire::put(&h[4], r.key_length);
  wire::put(&h[8], r.arg);
  return h;
}

/// Validates a request header from the network. @returns the reason it is refused, or nothing.
inline std::optional<std::string> decode(const header& h, request& r) {
  auto what = wire::get<std::uint8_t>(&h[0]);
  if (what < 1 || what > 3) return "unknown store operation " + std::to_string(what);
  if (h[1] != std::byte{0} || h[2] != std::byte{0} || h[3] != std::byte{0}) return "nonzero padding";
  r.what = static_cast<op>(what);
  r.key_length = wire::get<std::uint32_t>(&h[4]);
  r.arg = wire::get<std::uint64_t>(&h[8]);
  if (r.key_length == 0 || r.key_length > max_store_key) return "key length " + std::to_string(r.key_length);
  if (r.what == op::set && r.arg > max_store_value) return "value of " + std::to_string(r.arg) + " bytes";
  return std::nullopt;
}

inline header encode_response(status s, std::uint64_t value) {
  header h{};
  wire::put(&h[0], static_cast<std::uint8_t>(s));
  wire::put(&h[8], value);
  return h;
}

}  // namespace detail::store_wire

/// Serves a store on one TCP port from its own I/O thread until destroyed.
class tcp_store_server {
 public:
  /// Listens on `bind_address`:`port` (0 picks a free port).
  /// @throws dtrain::error if the address cannot be bound
  tcp_store_server(const std::string& bind_address, std::uint16_t port,
                   std::string token = detail::auth::load_token(std::nullopt))
      : token_(std::move(token)), acceptor_(io_) {
    port_ = detail::listen_on(acceptor_, bind_address, port, "the store",
                              port == 0 ? "" : " (DTRAIN_MASTER_PORT or MASTER_PORT picks another port)");
    accept_next();
    thread_ = std::thread([this] { io_.run(); });
  }

  tcp_store_server(const tcp_store_server&) = delete;
  tcp_store_server& operator=(const tcp_store_server&) = delete;

  ~tcp_store_server() {
    io_.stop();
    thread_.join();
    waiters_.clear();
    sessions_.clear();  // sockets close here, before the io_context they belong to
  }

  std::uint16_t port() const noexcept { return port_; }

 private:
  struct session {
    explicit session(detail::tcp::socket s) : socket(std::move(s)), timer(socket.get_executor()) {}
    detail::tcp::socket socket;
    boost::asio::steady_timer timer;
    detail::store_wire::header head{};
    detail::store_wire::request req;
    std::string key;
    std::vector<std::byte> value;
    detail::store_wire::header reply{};
    bool waiting = false;
  };
  using session_ptr = std::shared_ptr<session>;

  void accept_next() {
    acceptor_.async_accept([this](boost::system::error_code ec, detail::tcp::socket s) {
      if (ec) return;
      auto sp = std::make_shared<session>(std::move(s));
      std::string from = detail::endpoint_text(sp->socket);
      detail::handshake::accept(
          sp->socket, token_, std::chrono::seconds(10),
          [](const detail::auth::hello& h) -> std::string {
            return h.who == detail::auth::role::store ? "" : "this port serves the rendezvous store";
          },
          [this, sp, from](std::error_code hec, std::string why, const detail::auth::hello&) {
            if (hec) {
              detail::log(detail::log_level::warn, "store refused a connection from " + from + ": " + why);
              boost::system::error_code ignored;
              sp->socket.close(ignored);
              return;
            }
            sessions_.push_back(sp);
            read_request(sp);
          });
      accept_next();
    });
  }

  void drop(const session_ptr& s, const std::string& why) {
    if (!why.empty()) {
      detail::log(detail::log_level::warn, "store closing a connection from " +
                                               detail::endpoint_text(s->socket) + ": " + why);
    }
    boost::system::error_code ignored;
    s->socket.close(ignored);
    s->timer.cancel();
    sessions_.remove(s);
  }

  void read_request(const session_ptr& s) {
    boost::asio::async_read(s->socket, boost::asio::buffer(s->head),
                            [this, s](boost::system::error_code ec, std::size_t) {
                              if (ec) return drop(s, "");
                              if (auto bad = detail::store_wire::decode(s->head, s->req)) {
                                return drop(s, "malformed request: " + *bad);
                              }
                              s->key.resize(s->req.key_length);
                              s->value.resize(s->req.what == detail::store_wire::op::set ? s->req.arg : 0);
                              std::array<boost::asio::mutable_buffer, 2> bufs{
                                  boost::asio::buffer(s->key), boost::asio::buffer(s->value)};
                              boost::asio::async_read(s->socket, bufs,
                                                      [this, s](boost::system::error_code e2, std::size_t) {
                                                        if (e2) return drop(s, "");
                                                        serve(s);
                                                      });
                            });
  }

  void serve(const session_ptr& s) {
    using detail::store_wire::op;
    using detail::store_wire::status;
    switch (s->req.what) {
      case op::set: {
        data_[s->key] = std::move(s->value);
        respond(s, status::ok, 0, nullptr);
        wake(s->key);
        return;
      }
      case op::add: {
        std::int64_t v = 0;
        auto it = data_.find(s->key);
        if (it != data_.end()) {
          v = std::strtoll(value_text(it->second).c_str(), nullptr, 10);
        }
        v += static_cast<std::int64_t>(s->req.arg);
        std::string text = std::to_string(v);
        auto bytes = as_value(text);
        data_[s->key].assign(bytes.begin(), bytes.end());
        respond(s, status::ok, static_cast<std::uint64_t>(v), nullptr);
        wake(s->key);
        return;
      }
      case op::get: {
        auto it = data_.find(s->key);
        if (it != data_.end()) return respond(s, status::ok, it->second.size(), &it->second);
        s->waiting = true;
        waiters_.emplace(s->key, s);
        s->timer.expires_after(std::chrono::milliseconds(s->req.arg));
        s->timer.async_wait([this, s](boost::system::error_code ec) {
          if (ec || !s->waiting) return;
          s->waiting = false;
          erase_waiter(s);
          respond(s, status::timeout, 0, nullptr);
        });
        return;
      }
    }
  }

  void wake(const std::string& key) {
    auto [lo, hi] = waiters_.equal_range(key);
    std::vector<session_ptr> ready;
    for (auto it = lo; it != hi; ++it) ready.push_back(it->second);
    waiters_.erase(lo, hi);
    const auto& v = data_[key];
    for (auto& s : ready) {
      s->waiting = false;
      s->timer.cancel();
      respond(s, detail::store_wire::status::ok, v.size(), &v);
    }
  }

  void erase_waiter(const session_ptr& s) {
    auto [lo, hi] = waiters_.equal_range(s->key);
    for (auto it = lo; it != hi; ++it) {
      if (it->second == s) {
        waiters_.erase(it);
        return;
      }
    }
  }

  void respond(const session_ptr& s, detail::store_wire::status st, std::uint64_t arg,
               const std::vector<std::byte>* value) {
    s->reply = detail::store_wire::encode_response(st, arg);
    if (value != nullptr) {
      s->value = *value;
    } else {
      s->value.clear();
    }
    std::array<boost::asio::const_buffer, 2> bufs{boost::asio::buffer(s->reply), boost::asio::buffer(s->value)};
    boost::asio::async_write(s->socket, bufs, [this, s](boost::system::error_code ec, std::size_t) {
      if (ec) return drop(s, "");
      read_request(s);
    });
  }

  std::string token_;
  boost::asio::io_context io_;
  detail::tcp::acceptor acceptor_;
  std::uint16_t port_ = 0;
  std::list<session_ptr> sessions_;                     // I/O thread only
  std::map<std::string, std::vector<std::byte>> data_;  // I/O thread only
  std::multimap<std::string, session_ptr> waiters_;     // I/O thread only
  std::thread thread_;
};

/// A client of a `tcp_store_server`. Every call is one request and its response, bounded by the
/// call's deadline; calls from several threads take turns.
class tcp_store : public detail::store_throwing_forms<tcp_store> {
 public:
  using detail::store_throwing_forms<tcp_store>::set;
  using detail::store_throwing_forms<tcp_store>::get;
  using detail::store_throwing_forms<tcp_store>::add;

  /// Connects to the server at `host`:`port`, retrying with backoff until `d` (the server may
  /// not be up yet). @throws dtrain::error on timeout or when the server refuses the token
  tcp_store(std::string host, std::uint16_t port, deadline d,
            std::string token = detail::auth::load_token(std::nullopt))
      : host_(std::move(host)), port_(port), token_(std::move(token)), socket_(io_) {
    std::error_code ec;
    std::string last;
    auto result = detail::retry_with_backoff(d, std::chrono::milliseconds(500), [&] {
      if (try_connect(d, ec, last)) return detail::attempt::done;
      bool refused = ec == errc::auth_failed || ec == errc::invalid_argument;
      return refused ? detail::attempt::give_up : detail::attempt::retry;
    });
    if (result == detail::attempt::done) return;
    if (result == detail::attempt::give_up) throw error(ec, "dtrain: store at " + where() + ": " + last);
    throw error(errc::timeout, "dtrain: cannot reach the rendezvous store at " + where() +
                                   " before the deadline (last error: " + last + ")");
  }

  const std::string& host() const noexcept { return host_; }
  std::uint16_t port() const noexcept { return port_; }

  bool set(const std::string& key, std::span<const std::byte> value, deadline d, std::error_code& ec) noexcept {
    if (!detail::valid_store_call(key, value.size(), ec)) return false;
    std::vector<std::byte> ignored;
    std::uint64_t arg = 0;
    return call({detail::store_wire::op::set, static_cast<std::uint32_t>(key.size()), value.size()},
                key, value, d, ec, arg, ignored);
  }

  std::vector<std::byte> get(const std::string& key, deadline d, std::error_code& ec) noexcept {
    std::vector<std::byte> out;
    if (!detail::valid_store_call(key, 0, ec)) return out;
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d.remaining()).count();
    std::uint64_t arg = 0;
    // The server answers "timeout" itself; the client waits a little longer for that answer.
    call({detail::store_wire::op::get, static_cast<std::uint32_t>(key.size()), static_cast<std::uint64_t>(ms)},
         key, {}, deadline::after(d.remaining()).later(std::chrono::seconds(5)), ec, arg, out);
    return out;
  }

  std::int64_t add(const std::string& key, std::int64_t delta, deadline d, std::error_code& ec) noexcept {
    if (!detail::valid_store_call(key, 0, ec)) return 0;
    std::vector<std::byte> ignored;
    std::uint64_t arg = 0;
    call({detail::store_wire::op::add, static_cast<std::uint32_t>(key.size()), static_cast<std::uint64_t>(delta)},
         key, {}, d, ec, arg, ignored);
    return ec ? 0 : static_cast<std::int64_t>(arg);
  }

 private:
  std::string where() const { return host_ + ":" + std::to_string(port_); }

  // Runs the io_context on this thread until `finished` or the deadline; on the deadline the
  // socket is closed, which ends the pending operation.
  bool run_until(deadline d, const bool& finished) {
    io_.restart();
    while (!finished) {
      if (io_.run_one_until(d.time()) == 0 && !finished) {
        if (!d.expired()) continue;
        boost::system::error_code ignored;
        socket_.close(ignored);
        io_.restart();
        io_.run();  // let the aborted handlers run
        return false;
      }
    }
    return true;
  }

  bool try_connect(deadline d, std::error_code& ec, std::string& why) {
    const std::string before = why;  // what the attempt before this one met
    boost::system::error_code ignored;
    socket_.close(ignored);
    socket_ = detail::tcp::socket(io_);
    detail::tcp::resolver resolver(io_);
    bool finished = false;
    resolver.async_resolve(
        host_, std::to_string(port_), [&](boost::system::error_code rec, detail::tcp::resolver::results_type eps) {
          if (rec) {
            ec = make_error_code(errc::peer_lost);
            why = "cannot resolve " + host_ + ": " + rec.message();
            finished = true;
            return;
          }
          boost::asio::async_connect(socket_, eps, [&](boost::system::error_code cec, const detail::tcp::endpoint&) {
            if (cec) {
              ec = make_error_code(errc::peer_lost);
              why = cec.message();
              finished = true;
              return;
            }
            detail::tune_socket(socket_, 0);
            detail::auth::hello mine;
            mine.who = detail::auth::role::store;
            detail::handshake::connect(socket_, token_, std::chrono::seconds(10), mine,
                                       [&](std::error_code hec, std::string text, const detail::auth::hello&) {
                                         ec = hec;
                                         why = std::move(text);
                                         finished = true;
                                       });
          });
        });
    if (!run_until(d, finished)) {
      // Cut off by the deadline (its handler may have said "operation canceled"): what an attempt
      // that ended met (refused, ...), else that nothing answered.
      ec = make_error_code(errc::timeout);
      why = before.empty() ? "no answer" : before;
      return false;
    }
    return !ec;
  }

  bool call(const detail::store_wire::request& req, const std::string& key, std::span<const std::byte> value,
            deadline d, std::error_code& ec, std::uint64_t& arg, std::vector<std::byte>& out) noexcept {
    std::lock_guard lock(m_);
    if (!socket_.is_open()) {
      ec = make_error_code(errc::peer_lost);
      return false;
    }
    auto head = detail::store_wire::encode(req);
    std::array<boost::asio::const_buffer, 3> bufs{boost::asio::buffer(head), boost::asio::buffer(key),
                                                  boost::asio::buffer(value.data(), value.size())};
    detail::store_wire::header reply{};
    bool finished = false;
    boost::system::error_code io_ec;
    boost::asio::async_write(socket_, bufs, [&](boost::system::error_code wec, std::size_t) {
      if (wec) {
        io_ec = wec;
        finished = true;
        return;
      }
      boost::asio::async_read(socket_, boost::asio::buffer(reply), [&](boost::system::error_code rec, std::size_t) {
        if (rec) {
          io_ec = rec;
          finished = true;
          return;
        }
        auto st = static_cast<detail::store_wire::status>(detail::wire::get<std::uint8_t>(&reply[0]));
        arg = detail::wire::get<std::uint64_t>(&reply[8]);
        if (st == detail::store_wire::status::timeout) {
          ec = make_error_code(errc::timeout);
          finished = true;
          return;
        }
        if (req.what != detail::store_wire::op::get) {
          finished = true;
          return;
        }
        if (arg > detail::max_store_value) {
          ec = make_error_code(errc::protocol_error);
          finished = true;
          return;
        }
        out.resize(static_cast<std::size_t>(arg));
        boost::asio::async_read(socket_, boost::asio::buffer(out), [&](boost::system::error_code vec, std::size_t) {
          io_ec = vec;
          finished = true;
        });
      });
    });
    ec.clear();
    if (!run_until(d, finished)) {
      ec = make_error_code(errc::timeout);
      return false;
    }
    if (io_ec) {
      boost::system::error_code ignored;
      socket_.close(ignored);
      ec = make_error_code(errc::peer_lost);
    }
    return !ec;
  }

  std::string host_;
  std::uint16_t port_;
  std::string token_;
  std::mutex m_;
  boost::asio::io_context io_;
  detail::tcp::socket socket_;
};

}  // namespace dtrain
