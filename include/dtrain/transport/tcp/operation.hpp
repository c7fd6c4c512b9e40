#pragma once
// What the TCP engine's parts share: its settings and a connection's reader and writer state
// (operations and early messages are the byte transports' shared `detail::byte_operation`).

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
#include "dtrain/transport/byte_operation.hpp"
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
  int late_ranks = 0;  // the highest ranks may connect after the group has formed
};

using operation = detail::byte_operation;
using op_ptr = byte_op_ptr;
using incoming = early_message;
using incoming_ptr = early_message_ptr;

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
  // A late rank not connected yet: its sends queue, its receives stay posted, until it connects
  // (`pending` is guarded by the engine lock; `connected` lets a waiter see it without the lock).
  bool pending = false;
  std::atomic<bool> connected{true};

  // Reader state: touched only by the thread holding `reading`.
  std::atomic<bool> reading{false};
  std::atomic<int> helpers{0};         // threads waiting on this peer that read for themselves
  std::atomic<bool> lazy{false};       // left disarmed by the last waiter; the reader re-arms it
  std::atomic<std::int64_t> left_at{0};  // when the last waiter left (steady clock ticks)
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
  // Bytes read past the current frame part (a small message's payload read with its header, or
  // the start of the next frame), consumed before the socket is read again. A read may take up
  // to its size beyond what the part needs: a small message then costs one recvmsg for its header
  // and payload (its payload copied once more, cheaper than a system call up to a few KiB).
  std::vector<std::byte> rx_ahead = std::vector<std::byte>(8192);
  std::size_t ahead_begin = 0, ahead_end = 0;
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

using match_keys = byte_match_keys;

inline std::string rank_text(int r) { return "rank " + std::to_string(r); }

}  // namespace dtrain::detail::tcp_engine
