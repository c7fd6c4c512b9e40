#pragma once
// One send or receive of a transport that moves framed bytes itself (TCP, shared memory), and a
// message that arrived before its receive was posted.

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "dtrain/concepts/completion.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/frame.hpp"
#include "dtrain/core/signature.hpp"
#include "dtrain/detail/match_queue.hpp"
#include "dtrain/detail/message_parts.hpp"
#include "dtrain/transport/progress.hpp"

namespace dtrain::detail {

struct byte_operation {
  enum class phase { queued, active };  // active: its bytes are moving (or it was matched)

  bool is_send = false;
  frame_kind kind = frame_kind::data;
  envelope env;                            // peer, tag, signature, size
  send_parts data;                         // send payload, gathered
  std::string owned;                       // payload of control frames
  receive_parts buffer;                    // receive: where a message that fits goes
  std::vector<std::byte>* grow = nullptr;  // receive: where a larger one goes

  // Shared with the same receive posted in another transport (the mixed transport's any-peer
  // receives): whichever matches a message first sets it, and the other is dropped.
  std::shared_ptr<std::atomic<bool>> claim;

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
using byte_op_ptr = std::shared_ptr<byte_operation>;

// Where a shared-memory `remote` frame's payload lies in its sender's memory, to be read with
// one copy when its receive comes; `frame_seq` is the frame to acknowledge once it is read.
struct remote_ranges {
  std::array<std::uint64_t, max_message_parts> address{}, bytes{};
  std::size_t count = 0;
  std::uint64_t frame_seq = 0;
};

// A message that arrived before its receive was posted.
struct early_message {
  int peer = 0;
  std::uint64_t tag = 0;
  signature sig{};
  std::size_t length = 0;
  std::unique_ptr<std::byte[]> data;
  std::size_t capacity = 0;  // of `data`, at least `length`
  bool complete = false;  // payload fully read; guarded by the engine lock
  byte_op_ptr claimed;    // the receive that matched it before its payload arrived
  std::optional<remote_ranges> remote;  // shared memory: the payload is still in the sender
};
using early_message_ptr = std::shared_ptr<early_message>;

// Why a receive posted in two transports completed in the one that did not take the message.
inline constexpr const char* served_by_the_other_transport = "served by the other transport";

// A receive wants (peer, tag); an early message came from its peer on its tag. A receive with a
// claim takes a message only if its twin in the other transport has not.
struct byte_match_keys {
  static match_key of_receive(const byte_op_ptr& r) noexcept { return {r->env.peer, r->env.tag}; }
  static match_key of_message(const early_message_ptr& in) noexcept { return {in->peer, in->tag}; }
  static bool claim(const byte_op_ptr& r) noexcept { return !r->claim || !r->claim->exchange(true); }
  static void drop(const byte_op_ptr& r) {
    r->complete(make_error_code(errc::cancelled), served_by_the_other_transport);
  }
};

}  // namespace dtrain::detail
