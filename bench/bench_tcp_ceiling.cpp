// What TCP loopback itself gives bench_ps's message patterns on this machine: two processes over
// bare blocking sockets, with no framing, matching, copying or updating at either end.
//   push       N bytes to the server, an 8-byte acknowledgement back
//   pull       a 16-byte request header, N bytes back
//   push+pull  N bytes each way
// `--depth K` keeps K requests in flight (a writer thread and a reader thread on the client), as
// a worker with K slices outstanding does; depth 1 is one request at a time, as bench_ps runs.
//
//   build/bench/bench_tcp_ceiling [--seconds 1] [--depth 1] [--json out.json]
//
// GB/s counts as bench_ps does: the value bytes moved (push+pull counts both directions). One
// request at a time, these are what the kernel moves when user space does nothing but call send
// and recv. With more in flight they are not a ceiling: this server reads a request only after
// writing the previous reply, where ZeroMQ's I/O thread overlaps the two (zmq_push_pull).

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <semaphore>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "push_pull_patterns.hpp"

namespace {

using clock_type = std::chrono::steady_clock;
using op = dtrain::bench::pattern;
using dtrain::bench::ack_bytes;
using dtrain::bench::request_header;

// No call may block longer than this: a peer that stops answering ends the run with a message.
constexpr int io_timeout_s = 30;

[[noreturn]] void die(const std::string& what) {
  fmt::print(stderr, "bench_tcp_ceiling: {}: {}\n", what, std::strerror(errno));
  std::exit(1);
}

void write_all(int fd, const void* data, std::size_t n, const char* what) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) die(std::string("sending ") + what);
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

// Returns false on a clean end of stream before any byte.
bool read_all(int fd, void* data, std::size_t n, const char* what) {
  auto* p = static_cast<char*>(data);
  const std::size_t want = n;
  while (n > 0) {
    ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k == 0 && n == want) return false;
    if (k <= 0) {
      if (k == 0) errno = ECONNRESET;
      die(std::string("receiving ") + what);
    }
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

void tune(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  timeval tv{io_timeout_s, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

// The server process: reads each request whole, answers from a buffer it already holds.
void serve(int fd) {
  std::vector<char> in, out;
  const std::array<char, ack_bytes> ack{};
  request_header h{};
  while (read_all(fd, &h, sizeof h, "a request header")) {
    if (h.what == op::done) return;
    if (h.what != op::pull) {
      in.resize(h.bytes);
      read_all(fd, in.data(), in.size(), "a request's payload");
    }
    if (h.what == op::push) {
      write_all(fd, ack.data(), ack.size(), "an acknowledgement");
      continue;
    }
    out.resize(h.bytes, 1);
    write_all(fd, out.data(), out.size(), "a reply");
  }
}

class client {
 public:
  explicit client(int fd) : fd_(fd) {}

  // Seconds per request for `what` with `bytes` of values, `depth` requests in flight.
  double time(op what, std::size_t bytes, int depth, double seconds) {
    payload_.resize(bytes, 2);
    reply_.resize(what == op::push ? ack_bytes : bytes);
    const request_header h{what, 0, bytes};
    const std::size_t payload = what == op::pull ? 0 : bytes;
    auto send_one = [&] { send_request(h, payload); };
    auto receive_one = [&] { read_all(fd_, reply_.data(), reply_.size(), "a reply"); };
    if (depth == 1) {
      auto round = [&] {
        send_one();
        receive_one();
      };
      for (int i = 0; i < 3; ++i) round();
      return timed(round, seconds);
    }
    // K in flight: the writer sends while fewer than K replies are owed; this thread collects
    // them, and keeps collecting after the time is up until the writer's last one is in (so the
    // server is never left blocked on a reply nobody reads).
    std::counting_semaphore<> slots(depth);
    std::atomic<bool> stop{false}, writer_done{false};
    std::atomic<long> sent{0};
    std::thread writer([&] {
      while (true) {
        slots.acquire();
        if (stop.load()) break;
        send_one();
        sent.fetch_add(1);
      }
      writer_done.store(true);
    });
    const auto t0 = clock_type::now();
    long received = 0;
    while (!(writer_done.load() && received == sent.load())) {
      if (received == sent.load()) {
        std::this_thread::yield();  // the writer is finishing a send, or leaving
        continue;
      }
      receive_one();
      ++received;
      if (!stop.load() && received >= 5 &&
          std::chrono::duration<double>(clock_type::now() - t0).count() >= seconds) {
        stop.store(true);
      }
      slots.release();
    }
    writer.join();
    return std::chrono::duration<double>(clock_type::now() - t0).count() / static_cast<double>(received);
  }

  void finish() {
    const request_header h{op::done, 0, 0};
    write_all(fd_, &h, sizeof h, "the closing request");
  }

 private:
  // Header and payload in one gathered send, resumed where a short send stopped.
  void send_request(const request_header& h, std::size_t payload) {
    iovec iov[2] = {{const_cast<request_header*>(&h), sizeof h}, {payload_.data(), payload}};
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = 2;
    for (std::size_t left = sizeof h + payload; left > 0;) {
      ssize_t k = ::sendmsg(fd_, &m, MSG_NOSIGNAL);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) die("sending a request");
      left -= static_cast<std::size_t>(k);
      for (auto done = static_cast<std::size_t>(k); done > 0;) {
        const std::size_t step = std::min(done, m.msg_iov[0].iov_len);
        m.msg_iov[0].iov_base = static_cast<char*>(m.msg_iov[0].iov_base) + step;
        m.msg_iov[0].iov_len -= step;
        done -= step;
        if (m.msg_iov[0].iov_len == 0 && m.msg_iovlen > 1) {
          ++m.msg_iov;
          --m.msg_iovlen;
        }
      }
    }
  }

  template <class Round>
  static double timed(Round round, double seconds) {
    long n = 0;
    const auto t0 = clock_type::now();
    double elapsed = 0;
    while (elapsed < seconds || n < 5) {
      round();
      ++n;
      elapsed = std::chrono::duration<double>(clock_type::now() - t0).count();
    }
    return elapsed / static_cast<double>(n);
  }

  int fd_;
  std::vector<char> payload_, reply_;
};

}  // namespace

int main(int argc, char** argv) {
  dtrain::bench::pattern_options o;
  CLI::App app{"TCP loopback's own speed for bench_ps's message patterns (bare sockets, two processes)"};
  o.add_to(app);
  CLI11_PARSE(app, argc, argv);

  int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  if (listener < 0) die("creating a socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listener, 1) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    die("listening on 127.0.0.1");
  }
  const pid_t child = ::fork();
  if (child < 0) die("starting the server process");
  if (child == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives the client
    ::close(listener);
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) die("connecting to the client");
    tune(fd);
    serve(fd);
    ::_exit(0);
  }
  timeval tv{io_timeout_s, 0};
  ::setsockopt(listener, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);  // bounds accept
  int fd = ::accept(listener, nullptr, nullptr);
  if (fd < 0) die("waiting for the server process to connect");
  ::close(listener);
  tune(fd);

  client c(fd);
  const auto results = dtrain::bench::run_patterns(o, [&](op what, std::size_t bytes) {
    return c.time(what, bytes, o.depth, o.seconds);
  });
  c.finish();
  int status = 0;
  ::waitpid(child, &status, 0);
  dtrain::bench::print_patterns("tcp", "bare TCP loopback, blocking sockets, 2 processes", o, results);
  return 0;
}
