#pragma once
/// @file
/// What a server joining a shard's chain starts from (ps/replication.hpp, `add_member`): the
/// copy that was the tail writes its state as of the membership update, and the joiner installs
/// it into an empty copy. Format (little-endian): "DTRNJOIN", sequence (u64), version (u64),
/// rounds applied (i64), the members that joined before (u32 count + i32 each), the last push
/// of each worker (u32 count + (u32 worker, u64 request id) each), then the sparse and the dense
/// table as checkpoints write them (ps/checkpoint.hpp), padded to whole 8-byte words.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/detail/checkpoint_io.hpp"
#include "dtrain/ps/checkpoint.hpp"

namespace dtrain::ps {

/// A shard's place in its chain, as the state sent to a joiner carries it.
struct chain_position {
  std::uint64_t sequence = 0;  ///< the last update the state includes
  std::uint64_t version = 0;
  std::int64_t rounds = 0;
  std::vector<int> joined;  ///< members that joined before, in order
  std::map<std::uint32_t, std::uint64_t> last_push;
};

namespace detail {
inline constexpr char transfer_magic[8] = {'D', 'T', 'R', 'N', 'J', 'O', 'I', 'N'};
}  // namespace detail

/// The state of a shard whose tables are `sparse` and `dense`, at `at`.
template <class Table>
std::vector<std::byte> write_shard_state(const chain_position& at, Table& sparse, Table& dense) {
  dtrain::detail::byte_writer w;
  for (char c : detail::transfer_magic) w.put(static_cast<std::uint8_t>(c));
  w.put(at.sequence);
  w.put(at.version);
  w.put(at.rounds);
  w.put(static_cast<std::uint32_t>(at.joined.size()));
  for (int s : at.joined) w.put(static_cast<std::int32_t>(s));
  w.put(static_cast<std::uint32_t>(at.last_push.size()));
  for (const auto& [worker, id] : at.last_push) {
    w.put(worker);
    w.put(id);
  }
  write_table(w, sparse);
  write_table(w, dense);
  while (w.bytes.size() % 8 != 0) w.put(std::uint8_t{0});
  return std::move(w.bytes);
}

/// Installs what `write_shard_state` wrote into the empty tables `sparse` and `dense`.
/// @throws dtrain::error `bad_data` naming `from` when the state is malformed or truncated
template <class Table>
chain_position read_shard_state(std::span<const std::byte> bytes, Table& sparse, Table& dense,
                                const std::string& from) {
  const std::string what = "the state of a shard from " + from;
  dtrain::detail::byte_reader r(bytes, what);
  for (char c : detail::transfer_magic) {
    if (r.get<std::uint8_t>() != static_cast<std::uint8_t>(c))
      throw error(errc::bad_data, what + " does not start with DTRNJOIN");
  }
  chain_position at;
  at.sequence = r.get<std::uint64_t>();
  at.version = r.get<std::uint64_t>();
  at.rounds = r.get<std::int64_t>();
  const auto joined = r.get<std::uint32_t>();
  r.need(static_cast<std::size_t>(joined) * 4);
  for (std::uint32_t i = 0; i < joined; ++i) at.joined.push_back(r.get<std::int32_t>());
  const auto pushes = r.get<std::uint32_t>();
  r.need(static_cast<std::size_t>(pushes) * 12);
  for (std::uint32_t i = 0; i < pushes; ++i) {
    const auto worker = r.get<std::uint32_t>();
    at.last_push[worker] = r.get<std::uint64_t>();
  }
  read_table(r, sparse, what);
  read_table(r, dense, what);
  if (r.remaining() >= 8)
    throw error(errc::bad_data, what + " has " + std::to_string(r.remaining()) + " bytes after its tables");
  return at;
}

}  // namespace dtrain::ps
