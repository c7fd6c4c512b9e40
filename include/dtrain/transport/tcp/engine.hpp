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
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "dtrain/concepts/completion.hpp"
#include "dtrain/core/deadline.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/frame.hpp"
#include "dtrain/detail/buffer_pool.hpp"
#include "dtrain/net/handshake.hpp"
#include "dtrain/transport/progress.hpp"
#include "dtrain/transport/tcp/connector.hpp"
#include "dtrain/transport/tcp/failures.hpp"
#include "dtrain/transport/tcp/operation.hpp"
#include "dtrain/transport/tcp/receive_path.hpp"
#include "dtrain/transport/tcp/write_pump.hpp"

namespace dtrain::detail::tcp_engine {

namespace asio = boost::asio;
using asio::ip::tcp;

// The engine: its public interface is here; it inherits four parts, connector (connection
// set-up), receive_path (reading, and messages to itself), write_pump (writing) and failures,
// which share the state below and reach it through `self()`.
class engine : private receive_path<engine>, private write_pump<engine>, private failures<engine>,
               private connector<engine> {
  friend class receive_path<engine>;
  friend class connector<engine>;
  friend class write_pump<engine>;
  friend class failures<engine>;

 public:
  engine(int rank, int size, settings s)
      : rank_(rank), size_(size), settings_(std::move(s)), conns_(static_cast<std::size_t>(size)),
        acceptor_(io_), work_(asio::make_work_guard(io_)) {
    epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
    stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    watch(EPOLL_CTL_ADD, stop_fd_, EPOLLIN, stop_key);
    watch(EPOLL_CTL_ADD, wake_fd_, EPOLLIN, wake_key);
    // A late rank above this one connects when it comes: its connection waits for it, so that
    // no connection is ever created or replaced once the group runs.
    for (int p = std::max(rank_ + 1, size_ - settings_.late_ranks); p < size_; ++p) {
      auto c = std::make_unique<connection>(p, -1);
      c->pending = true;
      c->connected.store(false, std::memory_order_relaxed);
      conns_[static_cast<std::size_t>(p)] = std::move(c);
    }
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
  /// Whether this host has two cores for each of the group's ranks on it (progress.hpp); known
  /// once the group formed (`count_ranks_here`).
  bool spare_cores() const noexcept { return spare_cores_.load(std::memory_order_relaxed); }
  /// Once the group formed: counts its ranks on this host, for the default progress.
  void count_ranks_here() { spare_cores_.store(spare_cores_for(this->ranks_here()), std::memory_order_relaxed); }

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

  using connector<engine>::connect_to;
  using connector<engine>::wait_for_accepts;
  using connector<engine>::close_listener;
  using connector<engine>::connect_late;

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
  op_ptr receive(int peer, std::uint64_t tag, scatter_list parts, std::vector<std::byte>* grow,
                 std::shared_ptr<std::atomic<bool>> claim = nullptr) {
    auto op = std::make_shared<operation>();
    op->claim = std::move(claim);
    op->env = envelope{peer, tag, signature{}, 0};
    op->buffer = receive_parts(parts);
    op->grow = grow;
    std::unique_lock lock(m_);
    // A message that arrived before the group failed is delivered all the same: it was sent
    // before the failure, and it may say more than "peer lost" (a stray message of another
    // collective is a mismatch). Only a receive with nothing to take fails.
    incoming_ptr in = queue_.find_message({peer, tag});
    const bool takes = in && (in->complete || !failed_);
    if (takes && !byte_match_keys::claim(op)) {  // its twin in the other transport was served
      lock.unlock();
      byte_match_keys::drop(op);
      return op;
    }
    if (failed_) {
      if (takes) {
        queue_.withdraw_message(in);
        lock.unlock();
        deliver(*in, *op);
        return op;
      }
      lock.unlock();
      op->complete(make_error_code(failure_code_), failure_);
      return op;
    }
    if (in) {
      queue_.withdraw_message(in);
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
    if (c == nullptr || !c->connected.load(std::memory_order_acquire)) return op->flag.wait(d, spin);
    const auto spin_until = deadline::clock::now() + spin;
    if (c->helpers.fetch_add(1, std::memory_order_acq_rel) == 0 && !c->lazy.load(std::memory_order_acquire)) {
      disarm(*c);  // no reader wake-ups while this thread reads
    }
    bool read = false;  // whether this wait read (or tried to): only then does it keep the connection
    while (!op->flag.done() && !d.expired()) {
      read = true;
      if (c->rx_closed.load(std::memory_order_acquire)) {
        op->flag.block_until(d);  // its failure completes the operation
        break;
      }
      if (!drain(*c)) {  // the reader thread is mid-frame; it finishes soon
        std::this_thread::yield();
        continue;
      }
      if (op->flag.done()) break;
      if (deadline::clock::now() < spin_until) {
        if (oversubscribed_) std::this_thread::yield();  // let the rank this one waits for run
        continue;
      }
      pollfd p{c->fd, POLLIN, 0};
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d.remaining()).count();
      ::poll(&p, 1, static_cast<int>(std::clamp<long long>(ms, 0, 50)));
    }
    if (read) c->left_at.store(deadline::clock::now().time_since_epoch().count(), std::memory_order_release);
    if (c->helpers.fetch_sub(1, std::memory_order_acq_rel) == 1 && !c->lazy.exchange(true)) {
      // Re-armed by the reader thread once no wait has read it for `lazy_idle` (1 ms), within
      // about two: back-to-back waits (a collective's steps and calls) never wake the reader.
      // A reader thread asleep without a timeout would never re-arm it: wake it, to poll every
      // millisecond. Both sides are sequentially consistent, so either it saw the count or we
      // see it asleep.
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
          if (c && c->open && !c->pending) open.push_back(c.get());
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

  /// Fails the group here and on every peer, telling each why (an abort frame: their waiting
  /// operations fail with `code`, naming this rank and `why`), and waits up to the linger time
  /// for the frames to go out.
  void abort(const std::string& why, errc code = errc::peer_lost) noexcept {
    try {
      const deadline d = deadline::after(settings_.linger);
      for (auto& frame : this->group_failed(why, -1, false, code)) frame->flag.block_until(d);
    } catch (...) {  // out of memory: the peers see this rank leave instead
    }
  }

  /// Frames the reader thread read because no thread waited on their connection.
  std::uint64_t frames_by_reader() const noexcept { return frames_by_reader_.load(std::memory_order_relaxed); }

  /// Text for errors after the group failed; empty while it is healthy.
  std::string failure() const {
    std::lock_guard lock(m_);
    return failure_;
  }

 private:
  int rank_;
  int size_;
  settings settings_;
  const bool oversubscribed_ = more_ranks_than_cores(size_);
  std::atomic<bool> spare_cores_{false};

  mutable std::mutex m_;
  std::condition_variable accept_cv_;
  std::condition_variable state_cv_;
  std::vector<std::unique_ptr<connection>> conns_;  // by peer rank; null for self
  // Posted receives and unexpected messages (guarded by m_).
  match_queue<op_ptr, incoming_ptr, match_keys> queue_;
  buffer_pool early_buffers_;  // the early messages' payloads, kept for the next ones
  bool failed_ = false;
  std::atomic<bool> stopping_{false};
  std::string failure_;
  errc failure_code_ = errc::peer_lost;  // what the group's failure raises

  asio::io_context io_;
  tcp::acceptor acceptor_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::thread io_thread_;
  int epoll_fd_ = -1;  // the reader thread's: every connection, EPOLLONESHOT
  std::atomic<int> lazy_count_{0};        // connections waiting for rearm_lazy
  std::atomic<bool> reader_asleep_{false};  // in (or entering) epoll_wait without a timeout
  std::atomic<std::uint64_t> frames_by_reader_{0};
  int stop_fd_ = -1;   // eventfd that ends the reader thread
  int wake_fd_ = -1;   // eventfd that makes it look at lazy connections
  std::thread reader_thread_;
};

}  // namespace dtrain::detail::tcp_engine
