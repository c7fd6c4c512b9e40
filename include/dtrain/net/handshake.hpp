#pragma once
// The authenticated handshake of net/auth.hpp as asynchronous Asio steps with one deadline,
// for both ends of a connection, and the socket options every dtrain connection gets.

#include <utility>  // before Asio (Boost 1.74)

#include <boost/asio.hpp>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <system_error>

#include "dtrain/net/auth.hpp"

namespace dtrain::detail {

namespace asio = boost::asio;
using asio::ip::tcp;

/// TCP_NODELAY (small control messages must not wait for delayed ACKs), and socket buffers when
/// asked for: 0 leaves them to the kernel's autotuning, which setting a size switches off.
inline void tune_socket(tcp::socket& s, int buffer_bytes) {
  boost::system::error_code ignored;
  s.set_option(tcp::no_delay(true), ignored);
  if (buffer_bytes > 0) {
    s.set_option(asio::socket_base::send_buffer_size(buffer_bytes), ignored);
    s.set_option(asio::socket_base::receive_buffer_size(buffer_bytes), ignored);
  }
}

/// Opens, binds and listens `a` on `address`:`port` (0 picks a free port). @returns the port.
/// @throws dtrain::error saying `who` cannot listen there, why, and `remedy`.
inline std::uint16_t listen_on(tcp::acceptor& a, const std::string& address, std::uint16_t port,
                               const std::string& who, const std::string& remedy = "") {
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(address, ec);
  std::string why = ec ? "'" + address + "' is not an IP address" : std::string();
  tcp::endpoint ep(addr, port);
  if (!ec) a.open(ep.protocol(), ec);
  if (!ec) a.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    throw error(errc::invalid_argument, "dtrain: " + who + " cannot listen on " + address + ":" +
                                            std::to_string(port) + ": " + (why.empty() ? ec.message() : why) + remedy);
  }
  return a.local_endpoint().port();
}

inline std::string endpoint_text(const tcp::socket& s) {
  boost::system::error_code ec;
  auto ep = s.remote_endpoint(ec);
  if (ec) return "an unknown address";
  return ep.address().to_string() + ":" + std::to_string(ep.port());
}

/// One handshake in flight. `done(ec, message, peer_hello)` is called exactly once, on the
/// socket's executor; on failure `message` says why in words a user can act on.
class handshake : public std::enable_shared_from_this<handshake> {
 public:
  using done_fn = std::function<void(std::error_code, std::string, const auth::hello&)>;
  /// Decides whether an acceptor admits a hello; returns the refusal reason, empty to admit.
  using admit_fn = std::function<std::string(const auth::hello&)>;

  static void accept(tcp::socket& s, std::string token, std::chrono::milliseconds timeout,
                     admit_fn admit, done_fn done) {
    auto h = std::shared_ptr<handshake>(new handshake(s, std::move(token), timeout, std::move(done)));
    h->admit_ = std::move(admit);
    h->start_timer();
    h->read_hello();
  }

  static void connect(tcp::socket& s, std::string token, std::chrono::milliseconds timeout,
                      const auth::hello& mine, done_fn done) {
    auto h = std::shared_ptr<handshake>(new handshake(s, std::move(token), timeout, std::move(done)));
    h->hello_ = mine;
    h->hello_.n = auth::random_nonce();
    h->hello_bytes_ = auth::encode(h->hello_);
    h->start_timer();
    h->send_hello();
  }

 private:
  handshake(tcp::socket& s, std::string token, std::chrono::milliseconds timeout, done_fn done)
      : s_(s), timer_(s.get_executor()), token_(std::move(token)), timeout_(timeout),
        done_(std::move(done)) {}

  void start_timer() {
    timer_.expires_after(timeout_);
    timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (ec || self->finished_) return;
      self->timed_out_ = true;
      boost::system::error_code ignored;
      self->s_.close(ignored);  // fails the pending read or write, which reports the timeout
    });
  }

  void finish(std::error_code ec, std::string message) {
    if (finished_) return;
    finished_ = true;
    timer_.cancel();
    done_(ec, std::move(message), hello_);
  }

  void io_failed(const boost::system::error_code& ec, const char* step) {
    if (timed_out_) {
      finish(make_error_code(errc::timeout),
             std::string("no ") + step + " within " + std::to_string(timeout_.count()) + " ms");
    } else {
      finish(make_error_code(errc::peer_lost), std::string("connection closed during the ") +
                                                   step + " (" + ec.message() + ")");
    }
  }

  // --- acceptor -----------------------------------------------------------------------------
  void read_hello() {
    asio::async_read(s_, asio::buffer(hello_bytes_),
                     [self = shared_from_this()](boost::system::error_code ec, std::size_t) {
                       if (ec) return self->io_failed(ec, "handshake hello");
                       self->on_hello();
                     });
  }

  void on_hello() {
    auto h = auth::decode(hello_bytes_);
    if (!h) return finish(make_error_code(errc::protocol_error), "the first bytes are not a dtrain hello");
    hello_ = *h;
    auth::challenge c;
    c.reason = admit_(hello_);
    c.status = c.reason.empty() ? 0 : 1;
    c.n = auth::random_nonce();
    nonce_a_ = c.n;
    c.proof = auth::prove(token_, "dtrain-acceptor", hello_bytes_, nonce_a_);
    challenge_bytes_ = auth::encode(c);
    refused_ = std::move(c.reason);
    asio::async_write(s_, asio::buffer(challenge_bytes_),
                      [self = shared_from_this()](boost::system::error_code ec, std::size_t) {
                        if (ec) return self->io_failed(ec, "handshake challenge");
                        if (!self->refused_.empty()) {
                          return self->finish(make_error_code(errc::invalid_argument), self->refused_);
                        }
                        self->read_response();
                      });
  }

  void read_response() {
    asio::async_read(s_, asio::buffer(proof_),
                     [self = shared_from_this()](boost::system::error_code ec, std::size_t) {
                       if (ec) return self->io_failed(ec, "handshake response (the peer may hold a different token)");
                       self->on_response();
                     });
  }

  void on_response() {
    bool ok = auth::same(proof_, auth::prove(token_, "dtrain-connector", hello_bytes_, nonce_a_));
    dtrain::detail::wire::put(verdict_.data(), std::uint32_t{ok ? 0u : 1u});
    asio::async_write(s_, asio::buffer(verdict_),
                      [self = shared_from_this(), ok](boost::system::error_code ec, std::size_t) {
                        if (!ok) {
                          return self->finish(make_error_code(errc::auth_failed),
                                              "the peer does not hold this job's token");
                        }
                        if (ec) return self->io_failed(ec, "handshake verdict");
                        self->finish({}, {});
                      });
  }

  // --- connector ----------------------------------------------------------------------------
  void send_hello() {
    asio::async_write(s_, asio::buffer(hello_bytes_),
                      [self = shared_from_this()](boost::system::error_code ec, std::size_t) {
                        if (ec) return self->io_failed(ec, "handshake hello");
                        self->read_challenge();
                      });
  }

  void read_challenge() {
    asio::async_read(s_, asio::buffer(challenge_bytes_),
                     [self = shared_from_this()](boost::system::error_code ec, std::size_t) {
                       if (ec) return self->io_failed(ec, "handshake challenge");
                       self->on_challenge();
                     });
  }

  void on_challenge() {
    auth::challenge c = auth::decode(challenge_bytes_);
    if (c.status != 0) return finish(make_error_code(errc::invalid_argument), "refused: " + c.reason);
    if (!auth::same(c.proof, auth::prove(token_, "dtrain-acceptor", hello_bytes_, c.n))) {
      return finish(make_error_code(errc::auth_failed),
                    "the peer does not hold this job's token (set the same DTRAIN_TOKEN or "
                    "DTRAIN_TOKEN_FILE on every rank)");
    }
    proof_ = auth::prove(token_, "dtrain-connector", hello_bytes_, c.n);
    asio::async_write(s_, asio::buffer(proof_),
                      [self = shared_from_this()](boost::system::error_code ec, std::size_t) {
                        if (ec) return self->io_failed(ec, "handshake response");
                        self->read_verdict();
                      });
  }

  void read_verdict() {
    asio::async_read(s_, asio::buffer(verdict_),
                     [self = shared_from_this()](boost::system::error_code ec, std::size_t) {
                       if (ec) {
                         return self->io_failed(ec, "handshake verdict (the peer may hold a different token)");
                       }
                       if (dtrain::detail::wire::get<std::uint32_t>(self->verdict_.data()) != 0) {
                         return self->finish(make_error_code(errc::auth_failed),
                                             "the peer refused this rank's token");
                       }
                       self->finish({}, {});
                     });
  }

  tcp::socket& s_;
  asio::steady_timer timer_;
  std::string token_;
  std::chrono::milliseconds timeout_;
  done_fn done_;
  admit_fn admit_;
  auth::hello hello_{};
  auth::hello_bytes hello_bytes_{};
  auth::challenge_bytes challenge_bytes_{};
  auth::nonce nonce_a_{};
  auth::mac proof_{};
  std::array<std::byte, 4> verdict_{};
  std::string refused_;
  bool finished_ = false;
  bool timed_out_ = false;
};

}  // namespace dtrain::detail
