#pragma once
// What the TCP engine's parts share: its settings, one send or receive (`operation`), a message
// that arrived before its receive (`incoming`), and a connection's reader and writer state.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include <unistd.h>

#include "dtrain/concepts/completion.hpp"
#include "dtrain/core/frame.hpp"
#include "dtrain/detail/match_queue.hpp"
#include "dtrain/detail/message_parts.hpp"
#include "dtrain/transport/progress.hpp"

namespace dtrain::detail::tcp_engine {

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

}  // namespace dtrain::detail::tcp_engine
