// ZeroMQ, the transport under ps-lite, running bench_ps's message patterns between two processes
// over TCP loopback: a DEALER worker and a ROUTER server, as ps-lite's van connects them, with
// zero-copy sends on both sides (zmq_msg_init_data, as ps-lite sends its SArrays). The server
// does nothing with a request but answer it: an upper bound for ps-lite with its summing handler.
//   push       N bytes to the server, an 8-byte acknowledgement back
//   pull       a 16-byte request header, N bytes back
//   push+pull  N bytes each way
//
//   build/bench/zmq_push_pull [--seconds 1] [--depth 1] [--json out.json]
//
// Same columns and counting as bench_tcp_ceiling and bench_ps (push+pull counts both directions).

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <zmq.h>

#include "../push_pull_patterns.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

using dtrain::bench::ack_bytes;
using dtrain::bench::pattern;
using dtrain::bench::request_header;

[[noreturn]] void die(const std::string& what) {
  fmt::print(stderr, "zmq_push_pull: {}: {}\n", what, zmq_strerror(zmq_errno()));
  std::exit(1);
}

// Sends `n` bytes at `p` without copying them (the buffer outlives the send).
void send_view(void* socket, const void* p, std::size_t n, int flags) {
  zmq_msg_t m;
  zmq_msg_init_data(&m, const_cast<void*>(p), n, nullptr, nullptr);
  if (zmq_msg_send(&m, socket, flags) < 0) die("sending");
}

void serve(const std::string& endpoint) {
  void* ctx = zmq_ctx_new();
  void* s = zmq_socket(ctx, ZMQ_ROUTER);
  int timeout_ms = 30000;  // a client that stops talking ends the server
  zmq_setsockopt(s, ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
  if (zmq_connect(s, endpoint.c_str()) != 0) die("connecting to the client");
  std::vector<char> reply;
  const std::array<char, ack_bytes> ack{};
  for (;;) {
    zmq_msg_t id, head, body;
    zmq_msg_init(&id);
    zmq_msg_init(&head);
    zmq_msg_init(&body);
    if (zmq_msg_recv(&id, s, 0) < 0 || zmq_msg_recv(&head, s, 0) < 0) die("receiving a request");
    request_header h{};
    std::memcpy(&h, zmq_msg_data(&head), sizeof h);
    if (h.what == pattern::done) break;
    if (h.what != pattern::pull && zmq_msg_recv(&body, s, 0) < 0) die("receiving a request's payload");
    if (zmq_msg_send(&id, s, ZMQ_SNDMORE) < 0) die("answering");
    if (h.what == pattern::push) {
      send_view(s, ack.data(), ack.size(), 0);
    } else {
      reply.resize(h.bytes, 1);
      send_view(s, reply.data(), reply.size(), 0);
    }
    zmq_msg_close(&body);
    zmq_msg_close(&head);
  }
  zmq_close(s);
  zmq_ctx_term(ctx);
}

class client {
 public:
  explicit client(void* socket) : s_(socket) {}

  double time(pattern what, std::size_t bytes, int depth, double seconds) {
    payload_.resize(bytes, 2);
    header_ = request_header{what, 0, bytes};
    for (int i = 0; i < depth; ++i) send_one();
    for (int i = 0; i < depth; ++i) receive_one();
    long done = 0;
    const auto t0 = clock_type::now();
    double elapsed = 0;
    for (int i = 0; i < depth; ++i) send_one();
    // Each reply lets one more request go while the time lasts; then the last `depth` drain.
    while (elapsed < seconds || done < 5) {
      receive_one();
      ++done;
      send_one();
      elapsed = std::chrono::duration<double>(clock_type::now() - t0).count();
    }
    for (int i = 0; i < depth; ++i) receive_one();
    done += depth;
    return std::chrono::duration<double>(clock_type::now() - t0).count() / static_cast<double>(done);
  }

  void finish() {
    header_ = request_header{pattern::done, 0, 0};
    send_view(s_, &header_, sizeof header_, 0);
  }

 private:
  void send_one() {
    const bool payload = header_.what != pattern::pull;
    send_view(s_, &header_, sizeof header_, payload ? ZMQ_SNDMORE : 0);
    if (payload) send_view(s_, payload_.data(), payload_.size(), 0);
  }
  void receive_one() {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, s_, 0) < 0) die("receiving a reply");
    zmq_msg_close(&m);
  }

  void* s_;
  request_header header_{};
  std::vector<char> payload_;
};

}  // namespace

int main(int argc, char** argv) {
  dtrain::bench::pattern_options o;
  CLI::App app{"ZeroMQ (ps-lite's transport) running bench_ps's message patterns over TCP loopback"};
  o.add_to(app);
  CLI11_PARSE(app, argc, argv);

  // The client binds a free port; the forked server connects to it.
  void* ctx = zmq_ctx_new();
  void* s = zmq_socket(ctx, ZMQ_DEALER);
  int timeout_ms = 30000;  // no wait outlasts this: a server that stops answering ends the run
  zmq_setsockopt(s, ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
  zmq_setsockopt(s, ZMQ_SNDTIMEO, &timeout_ms, sizeof timeout_ms);
  if (zmq_bind(s, "tcp://127.0.0.1:*") != 0) die("binding 127.0.0.1");
  char endpoint[256];
  std::size_t endpoint_len = sizeof endpoint;
  zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, endpoint, &endpoint_len);
  const pid_t child = ::fork();
  if (child < 0) die("starting the server process");
  if (child == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    serve(endpoint);  // its own context: a forked process must not use the parent's
    ::_exit(0);
  }

  client c(s);
  const auto results = dtrain::bench::run_patterns(o, [&](pattern what, std::size_t bytes) {
    return c.time(what, bytes, o.depth, o.seconds);
  });
  c.finish();
  int status = 0;
  ::waitpid(child, &status, 0);
  zmq_close(s);
  zmq_ctx_term(ctx);
  dtrain::bench::print_patterns("zmq",
                                fmt::format("ZeroMQ {}.{}.{} DEALER/ROUTER over TCP loopback, 2 processes",
                                            ZMQ_VERSION_MAJOR, ZMQ_VERSION_MINOR, ZMQ_VERSION_PATCH),
                                o, results);
  return 0;
}
