#pragma once
/// @file
/// The parameter server's messages, carried by any `transport` on two tags: requests from
/// workers to servers, responses back. Every message starts with a 56-byte little-endian header;
/// a request's payload is its keys (u64 each) then its values, a response's payload is values
/// (a pull) or an error text. `decode_*` check every field against the bytes received, so a
/// malformed message is a typed error, never a read past the end.
///
/// | off | size | request                          | response                     |
/// |-----|------|----------------------------------|------------------------------|
/// |   0 |    4 | magic "DTPS"                     | magic "DTPS"                 |
/// |   4 |    1 | op                               | op (echoed)                  |
/// |   5 |    1 | table (0 sparse, 1 dense)        | status (0 ok, else errc)     |
/// |   6 |    1 | key cache: 0 none, 1 store, 2 use| reserved (0)                 |
/// |   7 |    1 | key cache slot                   | reserved (0)                 |
/// |   8 |    8 | request id                       | request id (echoed)          |
/// |  16 |    8 | clock: the worker's clocks done | server version at the reply  |
/// |  24 |    8 | basis: server version last pulled| slowest worker's clock       |
/// |  32 |    8 | key count                        | value count                  |
/// |  40 |    4 | values per key                   | first server joined, rank + 1|
/// |  44 |    4 | worker id                        | server id                    |
/// |  48 |    4 | shard (the key range addressed)  | shard (echoed)               |
/// |  52 |    4 | flags (`request_flags`)          | second server joined, or 0   |
///
/// A request names its shard because a server may head several: its own, and after a fail-over
/// the shards whose heads died before it (ps/chain.hpp). Between servers (`replicate`), `worker`
/// is the worker whose push the update is (`no_worker` for a round's or group's mean) and `clock`
/// is that push's request id, or the round's clock: what a new head deduplicates re-sends by.
/// A standby joining a chain sends `join` to the head; the copy before it answers with `state`
/// (ps/shard_transfer.hpp); a `replicate` flagged `membership` carries the join down the chain.
/// A server that gives up its copy of a shard (it moved) tells the chain's other members with
/// `leave`, and answers the workers' requests for it with status `shard_moved`.

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "dtrain/core/deadline.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/frame.hpp"
#include "dtrain/core/hash.hpp"
#include "dtrain/core/signature.hpp"

namespace dtrain::ps {

/// What a request asks of a server.
enum class op : std::uint8_t {
  hello = 1,      ///< a worker joins; the reply says the server is up (payload: config digest)
  push = 2,       ///< gradients (or deltas) for keys, part of the worker's current clock
  pull = 3,       ///< the values of keys, once the consistency model allows
  clock = 4,      ///< the worker finished a clock; the reply waits while it is too far ahead
  heartbeat = 5,  ///< liveness only; no reply
  checkpoint = 6, ///< write a checkpoint now
  goodbye = 7,    ///< the worker is done; it no longer holds anyone back
  push_pull = 8,  ///< a push, then a pull of the same keys, in one request and one reply
  // Between servers (chain replication, ps/replication.hpp); no reply.
  replicate = 9,   ///< an update the sender applied, for the next copy of its shard (id: sequence)
  replicated = 10, ///< the tail holds a shard's updates up to sequence `id` (to the head)
  join = 11,       ///< a standby server asks a shard's head to add it to the chain, as its tail
  state = 12,      ///< a shard's state as of sequence `id`, from the old tail to the one joining
  enter = 13,      ///< a late worker joins the running job: clock 0 asks where (the reply's slowest
                   ///< names a clock the shard holds for it), clock c > 0 enters at c
  hand_over = 14,  ///< a server about to leave asks a standby to take its place in its chains
  leave = 15,      ///< a server gives up its copy of a shard (it moved): that chain closes over it
  done = 16,       ///< a server ended its job, every worker having said goodbye (to the standbys)
};

/// The name of `o`, for messages.
constexpr const char* op_name(op o) noexcept {
  switch (o) {
    case op::hello: return "hello";
    case op::push: return "push";
    case op::pull: return "pull";
    case op::clock: return "clock";
    case op::heartbeat: return "heartbeat";
    case op::checkpoint: return "checkpoint";
    case op::goodbye: return "goodbye";
    case op::push_pull: return "push_pull";
    case op::replicate: return "replicate";
    case op::replicated: return "replicated";
    case op::join: return "join";
    case op::state: return "state";
    case op::enter: return "enter";
    case op::hand_over: return "hand_over";
    case op::leave: return "leave";
    case op::done: return "done";
  }
  return "request";
}

/// Whether requests of kind `o` carry keys (and may name a key cache slot).
constexpr bool carries_keys(op o) noexcept { return o == op::push || o == op::pull || o == op::push_pull; }

/// Which of a server's tables a request addresses.
enum class table_id : std::uint8_t { sparse = 0, dense = 1 };

/// Key caching (Li et al., OSDI 2014, section 3.5): a worker that sends a server the same key
/// list again (a model's fixed feature set, the same minibatch keys every epoch) names it by a
/// cache slot instead of sending it, and the server reuses what it resolved the keys to.
enum class key_cache : std::uint8_t {
  none = 0,   ///< the keys are in the request
  store = 1,  ///< the keys are in the request; the server keeps them in `cache_slot`
  use = 2,    ///< the request carries no keys: they are the `keys` in `cache_slot`
};

struct request_header {
  op what = op::heartbeat;
  table_id table = table_id::sparse;
  std::uint64_t id = 0;
  std::int64_t clock = 0;
  std::uint64_t basis = 0;
  std::uint64_t keys = 0;
  std::uint32_t length = 0;  ///< values per key (push) or expected per key (pull)
  std::uint32_t worker = 0;
  key_cache cache = key_cache::none;
  std::uint8_t cache_slot = 0;
  std::uint32_t shard = 0;
  std::uint32_t flags = 0;  ///< `request_flags`
};

/// Bits of `request_header::flags`.
enum request_flags : std::uint32_t {
  resent = 1,       ///< a worker sends the request again, to a new head, after a server was lost
  ends_version = 2, ///< between servers: the last message of one update (a version of the shard)
  membership = 4,   ///< between servers: not an update, server `worker` joins the chain as its tail
  worker_done = 8,  ///< a heartbeat: the worker said goodbye to every shard (to standby servers)
};

struct response_header {
  op what = op::heartbeat;
  std::uint8_t status = 0;  ///< 0, `shard_moved`, or an `errc` value; the payload is then the error text
  std::uint64_t id = 0;
  std::uint64_t version = 0;
  std::int64_t slowest = 0;
  std::uint64_t values = 0;
  std::uint32_t server = 0;
  std::uint32_t shard = 0;
  /// The first two live servers that joined the shard's chain, as rank + 1 (0: none), so a
  /// worker knows where the shard goes once the copies it started with are lost.
  std::array<std::uint32_t, 2> joined{};
};

inline constexpr std::size_t header_bytes = 56;
/// `response_header::status` of a request for a shard the server gave up (it moved to a server
/// added to the job, which `joined` names): not an error; the worker sends it to the shard's
/// head now, with the requests the server had not answered.
inline constexpr std::uint8_t shard_moved = 128;
/// `request_header::worker` of an update between servers that is a mean, not one worker's push.
inline constexpr std::uint32_t no_worker = 0xffffffff;
inline constexpr std::uint32_t protocol_magic = 0x53505444;  // "DTPS"

namespace detail {
using dtrain::detail::wire::get;
using dtrain::detail::wire::put;

inline void put_common(std::byte* b, op what, std::uint8_t byte5) {
  put(b, protocol_magic);
  put(b + 4, static_cast<std::uint8_t>(what));
  put(b + 5, byte5);
  put(b + 6, std::uint16_t{0});
}

inline bool known(op o) { return o >= op::hello && o <= op::done; }
}  // namespace detail

/// FNV-1a of a name (a consistency model's), for the hello's configuration check.
inline std::uint64_t name_digest(std::string_view s) noexcept { return fnv1a().text(s).value(); }

/// The dtrain error code of `e`, or `protocol_error` for an error of another category.
inline errc code_of(const std::system_error& e) noexcept {
  return e.code().category() == error_category() ? static_cast<errc>(e.code().value()) : errc::protocol_error;
}

/// An encoded message. Its bytes are allocated without being zeroed first, since encoding
/// writes every one of them (a 16 MiB pull reply is not worth an extra pass over memory).
class message {
 public:
  explicit message(std::size_t n) : data_(new std::byte[n]), size_(n) {}
  std::byte* data() noexcept { return data_.get(); }
  std::size_t size() const noexcept { return size_; }
  std::span<const std::byte> bytes() const noexcept { return {data_.get(), size_}; }
  /// The values after the header, as `T` (the header keeps them aligned for T up to 8 bytes).
  template <class T>
  T* values(std::size_t keys = 0) noexcept {
    return reinterpret_cast<T*>(data_.get() + header_bytes + 8 * keys);
  }

 private:
  std::unique_ptr<std::byte[]> data_;
  std::size_t size_;
};

/// A message being sent and the transport's handle for it: the bytes must live until the send
/// completes.
template <class Handle>
struct outgoing_message {
  explicit outgoing_message(message m) : bytes(std::move(m)) {}
  message bytes;
  std::optional<Handle> handle;
};

/// Waits until every message in `sends` (`outgoing_message`s, or anything with a `handle`) has
/// left or `d` passes, then forgets them: a peer that left takes its messages with it.
template <class Sends>
void wait_all_sent(Sends& sends, deadline d) noexcept {
  for (auto& s : sends) {
    std::error_code ec;
    s.handle->wait(d, ec);
  }
  sends.clear();
}

/// Sends the notice `bytes` on `tag` to every rank in `ranks` (ints), all within one deadline of
/// at most a second (less if the job's `timeout` is shorter), and withdraws what has not left by
/// then: a notice (a worker's end, a server's) goes to peers that may be gone already, and must
/// never hold up the one leaving.
template <class Transport, class Ranks>
void send_notice(Transport& t, Ranks&& ranks, std::uint64_t tag, const message& bytes,
                 std::chrono::milliseconds timeout) {
  const deadline d = deadline::after(std::min<std::chrono::milliseconds>(timeout, std::chrono::seconds(1)));
  for (int r : ranks) {
    std::error_code ignored;
    auto sent = t.isend(r, tag, signature{}, bytes.bytes());
    if (!sent.wait(d, ignored)) sent.cancel();
  }
}

/// The tag the reply to request `id` travels on, when requests use `request_tag`. Each request
/// has its own, so the worker posts the reply's receive with its destination (the caller's
/// buffer) before sending and the values land there; id 0 is for replies to requests whose id
/// could not be read.
constexpr std::uint64_t reply_tag(std::uint64_t request_tag, std::uint64_t id) noexcept { return request_tag + 1 + id; }

/// Writes a request's header: `keys` is the key count that follows it (with `key_cache::use`,
/// the count of the cached list, which stays behind).
inline void encode_request_header(const request_header& h, std::uint64_t keys, std::span<std::byte, header_bytes> out) {
  std::byte* b = out.data();
  detail::put_common(b, h.what, static_cast<std::uint8_t>(h.table));
  detail::put(b + 6, static_cast<std::uint8_t>(h.cache));
  detail::put(b + 7, h.cache_slot);
  detail::put(b + 8, h.id);
  detail::put(b + 16, h.clock);
  detail::put(b + 24, h.basis);
  detail::put(b + 32, keys);
  detail::put(b + 40, h.length);
  detail::put(b + 44, h.worker);
  detail::put(b + 48, h.shard);
  detail::put(b + 52, h.flags);
}

/// A request: header, `keys` (u64 each), then `values` bytes. With `key_cache::use` the keys
/// stay behind (pass none) and the header's key count is `h.keys`. (A worker sends the header,
/// keys and values where they are, gathered; this contiguous form is for tests and heartbeats.)
template <class T>
message encode_request(const request_header& h, std::span<const std::uint64_t> keys, std::span<const T> values) {
  const bool cached = h.cache == key_cache::use;
  DTRAIN_ASSERT(!cached || keys.empty(), "a request that uses cached keys carries none");
  message b(header_bytes + keys.size() * 8 + values.size_bytes());
  encode_request_header(h, cached ? h.keys : keys.size(), std::span<std::byte, header_bytes>(b.data(), header_bytes));
  std::byte* p = b.data() + header_bytes;
  if constexpr (std::endian::native == std::endian::little) {
    if (!keys.empty()) std::memcpy(p, keys.data(), keys.size_bytes());
    p += keys.size_bytes();
  } else {
    for (std::uint64_t k : keys) {
      detail::put(p, k);
      p += 8;
    }
  }
  if (!values.empty()) std::memcpy(p, values.data(), values.size_bytes());  // host order: same machine type
  return b;
}

/// A decoded request: views into the received bytes.
template <class T>
struct request_view {
  request_header header;
  std::vector<std::uint64_t> keys;  ///< empty with `key_cache::use`: the server has them
  std::span<const std::byte> values;  ///< `sizeof(T)` bytes per value

  /// The values, read in place. They are the representation of T values the transport copied
  /// in; the header and keys keep them aligned (the buffer comes from operator new).
  std::span<const T> typed_values() const noexcept {
    return {reinterpret_cast<const T*>(values.data()), values.size() / sizeof(T)};
  }
};

/// Checks and decodes a request. @throws dtrain::error `protocol_error` saying what is wrong
template <class T>
request_view<T> decode_request(std::span<const std::byte> b, int from) {
  auto bad = [&](const std::string& what) {
    return error(errc::protocol_error, "ps: malformed request from rank " + std::to_string(from) + ": " + what);
  };
  if (b.size() < header_bytes) throw bad(std::to_string(b.size()) + " bytes, shorter than a header");
  if (detail::get<std::uint32_t>(b.data()) != protocol_magic) throw bad("wrong magic");
  request_view<T> r;
  r.header.what = static_cast<op>(detail::get<std::uint8_t>(b.data() + 4));
  if (!detail::known(r.header.what)) throw bad("unknown op " + std::to_string(static_cast<int>(r.header.what)));
  const auto table = detail::get<std::uint8_t>(b.data() + 5);
  if (table > 1) throw bad("unknown table " + std::to_string(table));
  r.header.table = static_cast<table_id>(table);
  r.header.id = detail::get<std::uint64_t>(b.data() + 8);
  r.header.clock = detail::get<std::int64_t>(b.data() + 16);
  r.header.basis = detail::get<std::uint64_t>(b.data() + 24);
  r.header.keys = detail::get<std::uint64_t>(b.data() + 32);
  r.header.length = detail::get<std::uint32_t>(b.data() + 40);
  r.header.worker = detail::get<std::uint32_t>(b.data() + 44);
  r.header.shard = detail::get<std::uint32_t>(b.data() + 48);
  r.header.flags = detail::get<std::uint32_t>(b.data() + 52);
  const auto cache = detail::get<std::uint8_t>(b.data() + 6);
  if (cache > 2) throw bad("unknown key cache mode " + std::to_string(cache));
  r.header.cache = static_cast<key_cache>(cache);
  r.header.cache_slot = detail::get<std::uint8_t>(b.data() + 7);
  if (r.header.cache != key_cache::none && !carries_keys(r.header.what))
    throw bad("key cache on a request without keys");
  const bool cached = r.header.cache == key_cache::use;
  const std::size_t payload = b.size() - header_bytes;
  if (!cached && r.header.keys > payload / 8) {
    throw bad(std::to_string(r.header.keys) + " keys in " + std::to_string(payload) + " bytes");
  }
  const std::size_t key_bytes = cached ? 0 : static_cast<std::size_t>(r.header.keys) * 8;
  r.values = b.subspan(header_bytes + key_bytes);
  if (r.values.size() % sizeof(T) != 0) throw bad("values are not whole elements");
  const std::size_t values = r.values.size() / sizeof(T);
  if ((r.header.what == op::push || r.header.what == op::push_pull || r.header.what == op::replicate) &&
      (r.header.length == 0 ? values != 0
                            : values % r.header.length != 0 || values / r.header.length != r.header.keys)) {
    throw bad(std::to_string(values) + " values for " + std::to_string(r.header.keys) + " keys of length " +
              std::to_string(r.header.length));
  }
  r.keys.resize(key_bytes / 8);
  if constexpr (std::endian::native == std::endian::little) {
    if (!r.keys.empty()) std::memcpy(r.keys.data(), b.data() + header_bytes, key_bytes);
  } else {
    for (std::size_t i = 0; i < r.keys.size(); ++i)
      r.keys[i] = detail::get<std::uint64_t>(b.data() + header_bytes + 8 * i);
  }
  return r;
}

/// A response with room for `values` values of T after the header (written by the caller, e.g.
/// a table's pull straight into `message::values<T>()`).
template <class T>
message response_with_room(const response_header& h, std::size_t values) {
  message b(header_bytes + values * sizeof(T));
  detail::put_common(b.data(), h.what, h.status);
  detail::put(b.data() + 8, h.id);
  detail::put(b.data() + 16, h.version);
  detail::put(b.data() + 24, h.slowest);
  detail::put(b.data() + 32, static_cast<std::uint64_t>(values));
  detail::put(b.data() + 40, h.joined[0]);
  detail::put(b.data() + 44, h.server);
  detail::put(b.data() + 48, h.shard);
  detail::put(b.data() + 52, h.joined[1]);
  return b;
}

/// A response: header, then values or an error text.
template <class T>
message encode_response(const response_header& h, std::span<const T> values) {
  message b(header_bytes + values.size_bytes());
  detail::put_common(b.data(), h.what, h.status);
  detail::put(b.data() + 8, h.id);
  detail::put(b.data() + 16, h.version);
  detail::put(b.data() + 24, h.slowest);
  detail::put(b.data() + 32, static_cast<std::uint64_t>(values.size()));
  detail::put(b.data() + 40, h.joined[0]);
  detail::put(b.data() + 44, h.server);
  detail::put(b.data() + 48, h.shard);
  detail::put(b.data() + 52, h.joined[1]);
  if (!values.empty()) std::memcpy(b.data() + header_bytes, values.data(), values.size_bytes());
  return b;
}

/// An error response carrying `text`.
inline message encode_error(response_header h, errc code, const std::string& text) {
  h.status = static_cast<std::uint8_t>(code);
  const auto* p = reinterpret_cast<const char*>(text.data());
  return encode_response<char>(h, std::span<const char>(p, text.size()));
}

/// Checks and decodes a response header. @throws dtrain::error `protocol_error`
inline response_header decode_response(std::span<const std::byte> b, int from) {
  auto bad = [&](const std::string& what) {
    return error(errc::protocol_error, "ps: malformed response from rank " + std::to_string(from) + ": " + what);
  };
  if (b.size() < header_bytes) throw bad(std::to_string(b.size()) + " bytes, shorter than a header");
  if (detail::get<std::uint32_t>(b.data()) != protocol_magic) throw bad("wrong magic");
  response_header h;
  h.what = static_cast<op>(detail::get<std::uint8_t>(b.data() + 4));
  if (!detail::known(h.what)) throw bad("unknown op");
  h.status = detail::get<std::uint8_t>(b.data() + 5);
  h.id = detail::get<std::uint64_t>(b.data() + 8);
  h.version = detail::get<std::uint64_t>(b.data() + 16);
  h.slowest = detail::get<std::int64_t>(b.data() + 24);
  h.values = detail::get<std::uint64_t>(b.data() + 32);
  h.server = detail::get<std::uint32_t>(b.data() + 44);
  h.shard = detail::get<std::uint32_t>(b.data() + 48);
  h.joined = {detail::get<std::uint32_t>(b.data() + 40), detail::get<std::uint32_t>(b.data() + 52)};
  return h;
}

}  // namespace dtrain::ps
