#pragma once
// The type-independent core of tcp_transport: one connection per peer, message matching, the
// write pump, failure propagation and the graceful goodbye.
//
// Threads: Asio's I/O thread accepts connections and runs handshakes; the reader thread runs an
// epoll over every connection. Data never passes through Asio.
// Receives: whoever reads a connection (a thread waiting on that peer, else the reader thread)
// decodes each frame header, then looks for a posted receive from that peer on that tag. If one
// is posted the payload goes straight into its buffer; otherwise into a fresh "unexpected"
// buffer that a later receive copies from (MPI's eager protocol).
// Sends: the calling thread writes with non-blocking sendmsg (header and payload gathered, no
// copy) as long as the socket takes the bytes; when it is full, the reader thread resumes the
// writing once the socket drains. Only one writer per connection at a time, so frames never
// interleave.

#include <utility>  // before Asio (Boost 1.74)

#include <boost/asio.hpp>
#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "dtrain/concepts/completion.hpp"
#include "dtrain/core/deadline.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/frame.hpp"
#include "dtrain/detail/backoff.hpp"
#include "dtrain/detail/handshake.hpp"
#include "dtrain/detail/log.hpp"
#include "dtrain/detail/match_queue.hpp"
#include "dtrain/detail/message_parts.hpp"
#include "dtrain/transport/progress.hpp"

namespace dtrain::detail::tcp_engine {

namespace asio = boost::asio;
using asio::ip::tcp;

/// Settings the engine needs (a subset of tcp_options, without the rendezvous parts).
struct settings {
  std::chrono::milliseconds handshake_timeout{10000};
  std::chrono::milliseconds linger{10000};
  std::uint64_t max_frame_bytes = std::uint64_t{1} << 30;
  int socket_buffer_bytes = 0;
  bool abort_group_on_peer_loss = true;
  std::string token;
  std::uint64_t epoch = 0;
};

// One send or receive.
struct operation {
  enum class phase { queued, active };  // active: its bytes are moving (or it was matched)

  bool is_send = false;
  frame_kind kind = frame_kind::data;
  envelope env;                            // peer, tag, signature, size
  send_parts data;                         // send payload, gathered
  std::string owned;                       // payload of control frames
  receive_parts buffer;                    // receive: where a message that fits goes
  std::vector<std::byte>* grow = nullptr;  // receive: where a larger one goes

  phase state = phase::queued;  // guarded by the engine lock
  frame_bytes header{};         // encoded when its write starts (sends)
  std::size_t written = 0;      // header + payload bytes written so far

  completion_flag flag;
  std::error_code ec;  // written before flag.set()
  std::string detail;  // why it failed, for the error text
  std::atomic<bool> completing{false};

  // The first completion wins: a failure path and a finishing read may race to complete it.
  void complete(std::error_code code, std::string why = {}) {
    if (completing.exchange(true)) return;
    ec = code;
    detail = std::move(why);
    flag.set();
  }
  std::size_t total() const noexcept { return frame_header::size + data.bytes(); }
};
using op_ptr = std::shared_ptr<operation>;

// A message that arrived before its receive was posted.
struct incoming {
  int peer = 0;
  std::uint64_t tag = 0;
  signature sig{};
  std::size_t length = 0;
  std::unique_ptr<std::byte[]> data;
  bool complete = false;  // payload fully read; guarded by the engine lock
  op_ptr claimed;         // the receive that matched it before its payload arrived
};
using incoming_ptr = std::shared_ptr<incoming>;

enum class rx_state { header, payload, discard, closed };

struct connection {
  connection(int p, int socket_fd) : peer(p), fd(socket_fd) {}
  ~connection() { close(); }
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;
  void close() noexcept {
    if (wfd >= 0) ::close(wfd);
    if (fd >= 0) ::close(fd);
    fd = wfd = -1;
  }
  int peer;
  int fd = -1;   // the socket, owned (taken from Asio: see adopt)
  int wfd = -1;  // a dup of it: the write side's epoll registration

  // Reader state: touched only by the thread holding `reading`.
  std::atomic<bool> reading{false};
  std::atomic<int> helpers{0};         // threads waiting on this peer that read for themselves
  std::atomic<bool> lazy{false};       // left disarmed by the last waiter; the reader re-arms it
  std::atomic<bool> rx_closed{false};  // nothing more will be read
  rx_state rx_phase = rx_state::header;
  frame_bytes rx_header{};
  std::size_t rx_have = 0;  // header bytes so far
  frame_header rx_frame{};  // the frame being read
  std::uint64_t rx_seq = 0;
  receive_parts rx_parts;       // where the payload goes
  std::size_t rx_done = 0;      // payload bytes read into rx_parts so far
  std::size_t rx_left = 0;      // payload (or discard) bytes still to read
  op_ptr rx_recv;               // the posted receive it is read into
  incoming_ptr rx_in;           // or the unexpected message
  bool rx_truncated = false;
  std::vector<std::byte> rx_scratch;  // discarded payloads
  std::vector<std::byte> rx_text;     // abort reasons

  // Writer and state: guarded by the engine lock.
  std::deque<op_ptr> sendq;
  bool writing = false;  // one writer at a time owns sendq.front()
  bool write_parked = false;  // the writer waits for room; the reader thread resumes it
  std::uint64_t tx_seq = 0;
  bool open = true;           // false once failed or closed
  bool departed = false;      // the peer said goodbye
  bool goodbye_acked = false; // the peer read everything up to our goodbye
  std::string lost;           // why the connection failed
};

// A receive wants (peer, tag); an unexpected message came from its peer on its tag.
struct match_keys {
  static match_key of_receive(const op_ptr& r) noexcept { return {r->env.peer, r->env.tag}; }
  static match_key of_message(const incoming_ptr& in) noexcept { return {in->peer, in->tag}; }
};

inline std::string rank_text(int r) { return "rank " + std::to_string(r); }

class engine {
 public:
  engine(int rank, int size, settings s)
      : rank_(rank), size_(size), settings_(std::move(s)), conns_(static_cast<std::size_t>(size)),
        acceptor_(io_), work_(asio::make_work_guard(io_)) {
    epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
    stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    watch(EPOLL_CTL_ADD, stop_fd_, EPOLLIN, stop_key);
    watch(EPOLL_CTL_ADD, wake_fd_, EPOLLIN, wake_key);
  }

  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;
  ~engine() {
    stop();
    conns_.clear();  // sockets go before the io_context they belong to
    ::close(epoll_fd_);
    ::close(stop_fd_);
    ::close(wake_fd_);
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }

  // --- connection set-up --------------------------------------------------------------------

  /// Binds and listens; @returns the port. @throws dtrain::error naming the address.
  std::uint16_t listen(const std::string& bind_address, std::uint16_t port) {
    return listen_on(acceptor_, bind_address, port, "rank " + std::to_string(rank_));
  }

  /// Starts the I/O thread and the accept loop (peers with a higher rank connect to us).
  void start() {
    accept_next();
    io_thread_ = std::thread([this] { io_.run(); });
    reader_thread_ = std::thread([this] { reader_loop(); });
  }

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
      throw error(ec, "dtrain: rank " + std::to_string(rank_) + " connecting to" + where + ": " + why);
    }
    throw error(errc::timeout, "dtrain: rank " + std::to_string(rank_) + " could not connect to" + where +
                                   " before the deadline (last error: " + why + ")");
  }

  /// Waits until every rank above this one has connected. @throws dtrain::error naming the
  /// ranks still missing.
  void wait_for_accepts(deadline d, std::chrono::milliseconds timeout) {
    std::unique_lock lock(m_);
    auto all_in = [&] {
      for (int p = rank_ + 1; p < size_; ++p) {
        if (!conns_[static_cast<std::size_t>(p)]) return false;
      }
      return true;
    };
    if (accept_cv_.wait_until(lock, d.time(), all_in)) return;
    std::string missing;
    for (int p = rank_ + 1; p < size_; ++p) {
      if (!conns_[static_cast<std::size_t>(p)]) missing += (missing.empty() ? "" : ", ") + std::to_string(p);
    }
    throw error(errc::timeout, "dtrain: rank " + std::to_string(rank_) + " timed out after " +
                                   std::to_string(timeout.count()) + " ms waiting for rank(s) " +
                                   missing + " to connect (epoch " + std::to_string(settings_.epoch) + ")");
  }

  /// The group is connected; incoming connections are no longer admitted.
  void close_listener() {
    asio::post(io_, [this] {
      boost::system::error_code ignored;
      acceptor_.close(ignored);
    });
  }

  // --- messages -----------------------------------------------------------------------------

  op_ptr send(int peer, std::uint64_t tag, const signature& sig, gather_list parts) {
    auto op = std::make_shared<operation>();
    op->is_send = true;
    op->data = send_parts(parts);
    op->env = envelope{peer, tag, sig, op->data.bytes()};
    if (op->data.bytes() > settings_.max_frame_bytes) {
      op->complete(make_error_code(errc::invalid_argument),
                   "a message of " + std::to_string(op->data.bytes()) + " bytes exceeds max_frame_bytes (" +
                       std::to_string(settings_.max_frame_bytes) + ")");
      return op;
    }
    if (peer == rank_) {
      send_to_self(op);
      return op;
    }
    enqueue(*conns_[static_cast<std::size_t>(peer)], op);
    return op;
  }

  // A receive into `parts`, or into `grow` when the message is larger (transport concept, item 6).
  op_ptr receive(int peer, std::uint64_t tag, scatter_list parts, std::vector<std::byte>* grow) {
    auto op = std::make_shared<operation>();
    op->env = envelope{peer, tag, signature{}, 0};
    op->buffer = receive_parts(parts);
    op->grow = grow;
    std::unique_lock lock(m_);
    if (failed_) {
      lock.unlock();
      op->complete(make_error_code(errc::peer_lost), failure_);
      return op;
    }
    if (incoming_ptr in = queue_.take_message({peer, tag})) {
      if (!in->complete) {
        in->claimed = op;  // the reader delivers when the payload is in
        op->state = operation::phase::active;
        return op;
      }
      lock.unlock();
      deliver(*in, *op);
      return op;
    }
    if (peer != any_peer && peer != rank_) {
      const connection& c = *conns_[static_cast<std::size_t>(peer)];
      if (!c.open || c.departed) {
        lock.unlock();
        op->complete(make_error_code(errc::peer_lost), departure_text(c));
        return op;
      }
    }
    queue_.post(op);
    return op;
  }

  // Waits for `op`, reading its peer's connection on this thread: the waiter becomes the
  // connection's reader (the reader thread stands aside while `helpers` > 0), so the message is
  // read and completed where it is awaited, with no hand-off between threads. Spins (polling
  // without sleeping) for `spin` first. Sends, any-peer and self receives wait on their flag.
  bool wait(const op_ptr& op, deadline d, std::chrono::microseconds spin) {
    if (op->flag.done()) return true;
    const int peer = op->env.peer;
    connection* c = op->is_send || peer < 0 || peer == rank_ ? nullptr : conns_[static_cast<std::size_t>(peer)].get();
    if (c == nullptr) return op->flag.wait(d, spin);
    const auto spin_until = deadline::clock::now() + spin;
    if (c->helpers.fetch_add(1, std::memory_order_acq_rel) == 0 && !c->lazy.load(std::memory_order_acquire)) {
      disarm(*c);  // no reader wake-ups while this thread reads
    }
    while (!op->flag.done() && !d.expired()) {
      if (c->rx_closed.load(std::memory_order_acquire)) {
        op->flag.block_until(d);  // its failure completes the operation
        break;
      }
      if (!drain(*c)) {  // the reader thread is mid-frame; it finishes soon
        std::this_thread::yield();
        continue;
      }
      if (op->flag.done() || deadline::clock::now() < spin_until) continue;
      pollfd p{c->fd, POLLIN, 0};
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d.remaining()).count();
      ::poll(&p, 1, static_cast<int>(std::clamp<long long>(ms, 0, 50)));
    }
    if (c->helpers.fetch_sub(1, std::memory_order_acq_rel) == 1 && !c->lazy.exchange(true)) {
      // Re-armed by the reader thread within a millisecond unless another wait comes first:
      // back-to-back waits (a collective's steps) then never wake the reader thread.
      // A reader thread already asleep without a timeout would never re-arm it: wake it. Both
      // sides are sequentially consistent, so either it saw the count or we see it asleep.
      lazy_count_.fetch_add(1);
      if (reader_asleep_.load()) {
        std::uint64_t one = 1;
        [[maybe_unused]] auto written = ::write(wake_fd_, &one, sizeof one);
      }
    }
    return op->flag.done();
  }

  /// Withdraws a queued operation. One whose bytes are moving is given the linger time to
  /// finish; after that its connection is closed, which ends it. Never blocks past that.
  void cancel(const op_ptr& op) noexcept {
    {
      std::lock_guard lock(m_);
      if (op->flag.done()) return;
      if (op->state == operation::phase::queued) {
        if (op->is_send) {
          auto& q = conns_[static_cast<std::size_t>(op->env.peer)]->sendq;
          q.erase(std::remove(q.begin(), q.end(), op), q.end());
        } else {
          queue_.withdraw_receive(op);
        }
        op->complete(make_error_code(errc::cancelled));
        return;
      }
    }
    if (op->flag.done()) return;
    if (op->flag.block_until(deadline::after(settings_.linger))) return;
    int peer = op->env.peer;
    if (peer >= 0 && peer != rank_) {
      connection_failed(*conns_[static_cast<std::size_t>(peer)], errc::cancelled,
                        "an operation in flight was cancelled and did not finish in time");
    }
    op->flag.block_until(deadline::after(std::chrono::seconds(5)));
  }

  /// Graceful shutdown: flush every connection, say goodbye, wait (up to the linger time) for
  /// each peer to confirm it has read everything, then stop the I/O thread.
  void stop() noexcept {
    if (!io_thread_.joinable()) return;
    std::vector<connection*> open;
    {
      std::lock_guard lock(m_);
      if (!failed_) {
        for (auto& c : conns_) {
          if (c && c->open) open.push_back(c.get());
        }
      }
    }
    for (connection* c : open) {
      auto bye = std::make_shared<operation>();
      bye->is_send = true;
      bye->kind = frame_kind::goodbye;
      bye->env.peer = c->peer;
      enqueue(*c, bye);
    }
    {
      std::unique_lock lock(m_);
      stopping_ = true;
      state_cv_.wait_until(lock, deadline::after(settings_.linger).time(), [&] {
        return std::all_of(open.begin(), open.end(), [](connection* c) { return c->goodbye_acked || !c->open; });
      });
    }
    std::uint64_t one = 1;
    [[maybe_unused]] auto written = ::write(stop_fd_, &one, sizeof one);
    reader_thread_.join();
    work_.reset();
    io_.stop();
    io_thread_.join();
    boost::system::error_code ignored;
    acceptor_.close(ignored);
    for (auto& c : conns_) {
      if (c) c->close();
    }
    fail_everything(make_error_code(errc::cancelled), "the transport was shut down");
  }

  /// Text for errors after the group failed; empty while it is healthy.
  std::string failure() const {
    std::lock_guard lock(m_);
    return failure_;
  }

 private:
  // --- accepting and connecting -------------------------------------------------------------

  void accept_next() {
    acceptor_.async_accept([this](boost::system::error_code ec, tcp::socket s) {
      if (ec) {
        if (ec != asio::error::operation_aborted && acceptor_.is_open()) accept_next();
        return;
      }
      auto sock = std::make_shared<tcp::socket>(std::move(s));
      std::string from = endpoint_text(*sock);
      handshake::accept(
          *sock, settings_.token, settings_.handshake_timeout,
          [this](const auth::hello& h) { return admit(h); },
          [this, sock, from](std::error_code hec, std::string why, const auth::hello& h) {
            if (hec) {
              log(log_level::warn, "rank " + std::to_string(rank_) + " refused a connection from " +
                                       from + ": " + why);
              boost::system::error_code ignored;
              sock->close(ignored);
              return;
            }
            log(log_level::debug, "rank " + std::to_string(rank_) + " accepted rank " +
                                      std::to_string(h.rank) + " from " + from);
            adopt(h.rank, std::move(*sock));
          });
      accept_next();
    });
  }

  std::string admit(const auth::hello& h) {
    if (h.who != auth::role::transport) return "this port serves a transport, not a store";
    if (h.world != size_) {
      return "group size " + std::to_string(h.world) + " where this group has " + std::to_string(size_);
    }
    if (h.epoch != settings_.epoch) {
      return "epoch " + std::to_string(h.epoch) + " where this group is at epoch " + std::to_string(settings_.epoch);
    }
    if (h.rank <= rank_ || h.rank >= size_) {
      return "rank " + std::to_string(h.rank) + " cannot connect to rank " + std::to_string(rank_) +
             " (only higher ranks connect)";
    }
    std::lock_guard lock(m_);
    if (conns_[static_cast<std::size_t>(h.rank)]) return "rank " + std::to_string(h.rank) + " is already connected";
    return {};
  }

  bool try_connect(int peer, const std::string& host, std::uint16_t port, deadline d,
                   std::error_code& ec, std::string& why) {
    auto sock = std::make_shared<tcp::socket>(io_);
    auto result = std::make_shared<std::promise<std::pair<std::error_code, std::string>>>();
    auto future = result->get_future();
    auto resolver = std::make_shared<tcp::resolver>(io_);
    auth::hello mine;
    mine.who = auth::role::transport;
    mine.rank = rank_;
    mine.world = size_;
    mine.epoch = settings_.epoch;
    auto timeout = std::min(settings_.handshake_timeout,
                            std::chrono::duration_cast<std::chrono::milliseconds>(d.remaining()) +
                                std::chrono::milliseconds(1));
    asio::post(io_, [=, this] {
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
              handshake::connect(*sock, settings_.token, timeout, mine,
                                 [=](std::error_code hec, std::string text, const auth::hello&) {
                                   result->set_value({hec, std::move(text)});
                                 });
            });
          });
    });
    if (future.wait_until(d.time() + std::chrono::milliseconds(50)) != std::future_status::ready) {
      asio::post(io_, [sock, resolver] {
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
      asio::post(io_, [sock] {
        boost::system::error_code ignored;
        sock->close(ignored);
      });
      return false;
    }
    std::promise<void> adopted;
    asio::post(io_, [&, this] {
      adopt(peer, std::move(*sock));
      adopted.set_value();
    });
    adopted.get_future().wait();
    return true;
  }

  // Runs on the I/O thread: the connection joins the group and its reader starts.
  void adopt(int peer, tcp::socket s) {
    tune_socket(s, settings_.socket_buffer_bytes);
    // The descriptor leaves Asio: its reactor watches every socket it owns (edge-triggered), so
    // each burst of arriving data would also wake the I/O thread, which has nothing to do with it.
    boost::system::error_code ec;
    const int fd = s.release(ec);
    if (ec) {  // the peer then counts as missing when the group forms, and is named there
      log(log_level::error, "rank " + std::to_string(rank_) + " could not take over its socket to rank " +
                                std::to_string(peer) + ": " + ec.message());
      return;
    }
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    auto c = std::make_unique<connection>(peer, fd);
    // Registered before it is published: a sender that finds the socket full at once parks on
    // the write registration, which must already exist.
    c->wfd = ::dup(c->fd);
    watch(EPOLL_CTL_ADD, c->fd, read_events, read_key(*c));
    watch(EPOLL_CTL_ADD, c->wfd, EPOLLONESHOT, write_key(*c));  // armed by wait_writable
    {
      std::lock_guard lock(m_);
      conns_[static_cast<std::size_t>(peer)] = std::move(c);
    }
    accept_cv_.notify_all();
  }

  // --- reading ------------------------------------------------------------------------------
  // A connection is read by whichever thread holds its `reading` flag: the reader thread when
  // epoll reports data, or a thread waiting for a receive from that peer (so the common case
  // costs no thread hand-off). The fd is registered EPOLLONESHOT; whoever releases the flag
  // re-arms it, and level-triggered readiness then reports anything that arrived meanwhile.

  // Connections a waiter left disarmed: watch them again, unless a waiter is back.
  void rearm_lazy() {
    for (auto& c : conns_) {
      if (!c || !c->lazy.load(std::memory_order_acquire)) continue;
      if (c->helpers.load(std::memory_order_acquire) > 0) continue;  // it will leave it lazy again
      c->lazy.store(false, std::memory_order_release);
      lazy_count_.fetch_sub(1, std::memory_order_acq_rel);
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
    ::epoll_ctl(epoll_fd_, op, fd, &ev);
  }

  // HUP and ERR are reported even unasked; EPOLLONESHOT lets them through once at most.
  void disarm(connection& c) { watch(EPOLL_CTL_MOD, c.fd, EPOLLONESHOT, read_key(c)); }
  void rearm(connection& c) { watch(EPOLL_CTL_MOD, c.fd, read_events, read_key(c)); }

  void reader_loop() {
    epoll_event events[64];
    while (true) {
      // Announce a sleep without timeout before deciding on it (see wait()).
      reader_asleep_.store(true);
      const int timeout = lazy_count_.load() > 0 ? 1 : -1;
      if (timeout > 0) reader_asleep_.store(false);
      int n = ::epoll_wait(epoll_fd_, events, 64, timeout);
      reader_asleep_.store(false);
      if (lazy_count_.load() > 0) rearm_lazy();
      for (int i = 0; i < n; ++i) {
        const std::uint64_t key = events[i].data.u64;
        if (key == stop_key) return;
        if (key == wake_key) {
          std::uint64_t count = 0;
          [[maybe_unused]] auto got = ::read(wake_fd_, &count, sizeof count);
          continue;
        }
        auto& c = *reinterpret_cast<connection*>(key & ~std::uint64_t{1});
        if (key & 1u) {  // the write side: room in the socket again
          {
            // Only a parked writer's turn is taken over; HUP and ERR arrive unasked.
            std::lock_guard lock(m_);
            if (!c.write_parked) continue;
            c.write_parked = false;
          }
          pump(c);
          continue;
        }
        if (c.helpers.load(std::memory_order_acquire) > 0) continue;  // a waiter reads; it re-arms
        drain(c);
      }
    }
  }

  // Reads whatever the socket holds and acts on it. @returns false if another thread is reading.
  bool drain(connection& c) {
    if (c.reading.exchange(true, std::memory_order_acquire)) return false;
    while (true) {
      iovec iov[max_message_parts];
      int parts = 1;
      switch (c.rx_phase) {
        case rx_state::header:
          iov[0] = {c.rx_header.data() + c.rx_have, frame_header::size - c.rx_have};
          break;
        case rx_state::payload:
          parts = remaining_iov(c.rx_parts.view(), c.rx_done, c.rx_left, iov);
          break;
        case rx_state::discard:
          c.rx_scratch.resize(1 << 16);
          iov[0] = {c.rx_scratch.data(), std::min<std::size_t>(c.rx_left, c.rx_scratch.size())};
          break;
        case rx_state::closed:
          c.reading.store(false, std::memory_order_release);
          return false;
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<decltype(msg.msg_iovlen)>(parts);
      ssize_t got = ::recvmsg(c.fd, &msg, MSG_DONTWAIT);
      if (got > 0) {
        auto n = static_cast<std::size_t>(got);
        if (c.rx_phase == rx_state::header) {
          c.rx_have += n;
          if (c.rx_have == frame_header::size) {
            c.rx_have = 0;
            on_header(c);
          }
        } else {
          if (c.rx_phase == rx_state::payload) c.rx_done += n;
          c.rx_left -= n;
          if (c.rx_left == 0) finish_payload(c);
        }
        continue;
      }
      if (got < 0 && errno == EINTR) continue;
      if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      std::string why = got == 0 ? "closed the connection without saying goodbye (process exited or was killed)"
                                 : "connection error: " + std::string(std::strerror(errno));
      fail_reception(c, "was lost mid-message");
      stop_reading(c);
      c.reading.store(false, std::memory_order_release);
      read_failed(c, why);
      return false;
    }
    c.reading.store(false, std::memory_order_release);
    if (c.helpers.load(std::memory_order_acquire) == 0) rearm(c);
    return true;
  }

  void on_header(connection& c) {
    auto r = decode_frame(c.rx_header, c.rx_seq, settings_.max_frame_bytes);
    if (!r.ok) {
      log(log_level::error, "rank " + std::to_string(rank_) + " closing the connection to rank " +
                                std::to_string(c.peer) + ": malformed frame: " + r.error);
      stop_reading(c);
      connection_failed(c, errc::protocol_error, "sent a malformed frame (" + r.error + ")");
      return;
    }
    ++c.rx_seq;
    c.rx_frame = r.header;
    const frame_header& h = c.rx_frame;
    switch (h.kind) {
      case frame_kind::data: return on_data(c, h);
      case frame_kind::goodbye: on_goodbye(c); break;
      case frame_kind::goodbye_ack: {
        std::lock_guard lock(m_);
        c.goodbye_acked = true;
        state_cv_.notify_all();
        break;
      }
      case frame_kind::abort:
        if (h.length > 4096) {
          stop_reading(c);
          connection_failed(c, errc::protocol_error, "sent an abort frame longer than 4096 bytes");
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
    std::unique_lock lock(m_);
    if (op_ptr recv = queue_.take_receive({c.peer, h.tag})) {
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
    in->data = std::make_unique_for_overwrite<std::byte[]>(len == 0 ? 1 : len);
    queue_.hold(in);
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
      std::unique_lock lock(m_);
      in->complete = true;
      op_ptr claimant = std::move(in->claimed);
      lock.unlock();
      if (claimant) deliver(*in, *claimant);
      return;
    }
    if (c.rx_frame.kind == frame_kind::abort && !c.rx_text.empty()) {
      std::string text;
      for (auto b : c.rx_text) {
        auto ch = static_cast<char>(b);
        text.push_back(ch >= ' ' && ch <= '~' ? ch : '?');
      }
      c.rx_text.clear();
      group_failed(rank_text(c.peer) + " aborted the group: " + text, c.peer);
    }
  }

  // The connection broke mid-frame: whoever waited on this frame fails.
  void fail_reception(connection& c, const std::string& what) {
    if (op_ptr recv = std::move(c.rx_recv)) recv->complete(make_error_code(errc::peer_lost), rank_text(c.peer) + " " + what);
    if (incoming_ptr in = std::move(c.rx_in)) {
      std::unique_lock lock(m_);
      op_ptr claimant = std::move(in->claimed);
      lock.unlock();
      if (claimant) claimant->complete(make_error_code(errc::peer_lost), rank_text(c.peer) + " " + what);
    }
  }

  void read_failed(connection& c, const std::string& why) {
    {
      std::lock_guard lock(m_);
      // After the peer's goodbye (it sent everything it will send) or during our own shutdown,
      // the end of the connection is expected, whether it comes as EOF or as a reset.
      if (c.departed || stopping_ || !c.open) {
        c.open = false;
        state_cv_.notify_all();
        return;
      }
    }
    connection_failed(c, errc::peer_lost, why);
  }

  void on_goodbye(connection& c) {
    std::vector<op_ptr> orphans;
    {
      std::lock_guard lock(m_);
      c.departed = true;
      // Everything the peer sent came before its goodbye; receives still waiting on it never
      // will be satisfied.
      orphans = queue_.take_receives_if([&](const op_ptr& r) { return r->env.peer == c.peer; });
    }
    for (auto& r : orphans) r->complete(make_error_code(errc::peer_lost), departure_text(c));
    auto ack = std::make_shared<operation>();
    ack->is_send = true;
    ack->kind = frame_kind::goodbye_ack;
    ack->env.peer = c.peer;
    enqueue(c, ack);
  }

  // --- writing ------------------------------------------------------------------------------

  void enqueue(connection& c, const op_ptr& op) {
    {
      std::lock_guard lock(m_);
      if (!c.open || (failed_ && op->kind == frame_kind::data)) {
        std::string why = c.open ? failure_ : departure_text(c);
        op->complete(make_error_code(errc::peer_lost), why);
        return;
      }
      if (c.departed && op->kind == frame_kind::data) {
        op->complete(make_error_code(errc::peer_lost), departure_text(c));
        return;
      }
      c.sendq.push_back(op);
      if (c.writing) return;
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
        std::lock_guard lock(m_);
        if (c.sendq.empty() || !c.open) {
          c.writing = false;
          if (!c.open) fail_queue(c);
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
        const int n = remaining_iov(std::span<const std::span<const std::byte>>(frame.data(), 1 + op->data.count()),
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
        int err = errno;
        {
          std::lock_guard lock(m_);
          c.sendq.pop_front();
          c.writing = false;
        }
        op->complete(make_error_code(errc::peer_lost), "write failed: " + std::string(std::strerror(err)));
        connection_failed(c, errc::peer_lost, "write failed: " + std::string(std::strerror(err)));
        return;
      }
      {
        std::lock_guard lock(m_);
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
      std::lock_guard lock(m_);
      c.write_parked = true;
    }
    watch(EPOLL_CTL_MOD, c.wfd, EPOLLOUT | EPOLLONESHOT, write_key(c));
  }

  // --- failure ------------------------------------------------------------------------------

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
    for (auto& op : q) op->complete(make_error_code(errc::peer_lost), departure_text(c));
  }

  void connection_failed(connection& c, errc code, const std::string& why) {
    std::vector<op_ptr> orphans;
    bool abort = false;
    {
      std::lock_guard lock(m_);
      if (!c.open) return;
      c.open = false;
      c.lost = rank_text(c.peer) + " " + why;
      (void)code;
      for (auto& r : queue_.take_receives_if([&](const op_ptr& w) { return w->env.peer == c.peer; })) {
        orphans.push_back(std::move(r));
      }
      fail_queue(c);
      // Half-read messages from this peer will never complete.
      queue_.take_messages_if([&](const incoming_ptr& in) { return in->peer == c.peer && !in->complete; });
      // The group's failure is recorded before anyone wakes, so what they read is complete.
      abort = settings_.abort_group_on_peer_loss && !stopping_ && !failed_;
      if (abort) {
        failed_ = true;
        failure_ = c.lost;
      }
      state_cv_.notify_all();
    }
    for (auto& r : orphans) r->complete(make_error_code(errc::peer_lost), c.lost);
    // shutdown, not close: a writer may still hold the descriptor, which must not be reused
    // under it. The socket is closed when the engine stops.
    ::shutdown(c.fd, SHUT_RDWR);
    if (abort) group_failed(c.lost, c.peer, true);
  }

  // The group cannot go on: fail every waiting receive, and tell the other peers why, so that
  // ranks that never talked to the lost one fail at once too, naming it.
  void group_failed(const std::string& why, int source, bool marked = false) {
    std::vector<op_ptr> orphans;
    std::vector<connection*> others;
    {
      std::lock_guard lock(m_);
      if (failed_ && !marked) return;
      failed_ = true;
      failure_ = why;
      orphans = queue_.take_receives_if(every);
      for (auto& c : conns_) {
        if (c && c->open && c->peer != source && !c->departed) others.push_back(c.get());
      }
    }
    log(log_level::warn, "rank " + std::to_string(rank_) + ": group failed: " + why);
    for (auto& r : orphans) r->complete(make_error_code(errc::peer_lost), why);
    for (connection* c : others) {
      auto abort = std::make_shared<operation>();
      abort->is_send = true;
      abort->kind = frame_kind::abort;
      abort->env.peer = c->peer;
      abort->owned = "rank " + std::to_string(rank_) + " reports: " + why;
      if (abort->owned.size() > 4000) abort->owned.resize(4000);
      enqueue(*c, abort);
    }
  }

  void fail_everything(std::error_code ec, const std::string& why) {
    std::vector<op_ptr> orphans;
    {
      std::lock_guard lock(m_);
      orphans = queue_.take_receives_if(every);
      for (auto& c : conns_) {
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

  // --- local delivery -----------------------------------------------------------------------

  void send_to_self(const op_ptr& op) {
    std::unique_lock lock(m_);
    if (op_ptr recv = queue_.take_receive({rank_, op->env.tag})) {
      recv->state = operation::phase::active;
      lock.unlock();
      incoming in;
      in.peer = rank_;
      in.tag = op->env.tag;
      in.sig = op->env.sig;
      in.length = op->data.bytes();
      copy_into(in, op->data, *recv);
      op->complete({});
      return;
    }
    auto in = std::make_shared<incoming>();
    in->peer = rank_;
    in->tag = op->env.tag;
    in->sig = op->env.sig;
    in->length = op->data.bytes();
    in->data = std::make_unique_for_overwrite<std::byte[]>(in->length == 0 ? 1 : in->length);
    scatter_copy(op->data, receive_parts(std::span<std::byte>(in->data.get(), in->length)));
    in->complete = true;
    queue_.hold(std::move(in));
    lock.unlock();
    op->complete({});
  }

  static void deliver(const incoming& in, operation& recv) {
    copy_into(in, send_parts(std::span<const std::byte>(in.data.get(), in.length)), recv);
  }

  static void copy_into(const incoming& in, const send_parts& from, operation& recv) {
    recv.env.peer = in.peer;
    recv.env.sig = in.sig;
    recv.env.bytes = in.length;
    const bool fits = copy_message(from, recv.buffer, recv.grow);
    recv.complete(fits ? std::error_code{} : make_error_code(errc::message_truncated));
  }

  int rank_;
  int size_;
  settings settings_;

  mutable std::mutex m_;
  std::condition_variable accept_cv_;
  std::condition_variable state_cv_;
  std::vector<std::unique_ptr<connection>> conns_;  // by peer rank; null for self
  // Posted receives and unexpected messages (guarded by m_).
  match_queue<op_ptr, incoming_ptr, match_keys> queue_;
  static constexpr auto every = [](const op_ptr&) { return true; };
  bool failed_ = false;
  std::atomic<bool> stopping_{false};
  std::string failure_;

  asio::io_context io_;
  tcp::acceptor acceptor_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::thread io_thread_;
  int epoll_fd_ = -1;  // the reader thread's: every connection, EPOLLONESHOT
  std::atomic<int> lazy_count_{0};        // connections waiting for rearm_lazy
  std::atomic<bool> reader_asleep_{false};  // in (or entering) epoll_wait without a timeout
  int stop_fd_ = -1;   // eventfd that ends the reader thread
  int wake_fd_ = -1;   // eventfd that makes it look at lazy connections
  std::thread reader_thread_;
};

}  // namespace dtrain::detail::tcp_engine
