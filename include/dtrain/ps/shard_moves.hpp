#pragma once
/// @file
/// Shards moving to a growing server (`roles::grows_into`), as one server decides them. A job
/// started with more shards than servers grows when a growing standby server comes: it joins the
/// chain of each shard it grows into, as a standby joins one (ps/replacements.hpp), and once it
/// is in, the shard's first copy gives its copy up: everything that copy applied is at the tail
/// by then, the chain's other members close over it (`op::leave`), and it answers the requests
/// for the shard with `shard_moved`, so each worker sends them to the new head. The shard keeps
/// its k copies throughout. ps/server.hpp sends the messages; this file decides and words them.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "dtrain/ps/chain.hpp"
#include "dtrain/ps/protocol.hpp"
#include "dtrain/ps/roles.hpp"

namespace dtrain::ps {

/// Whether server `me`, which heads shard `s`, gives it up now: it is the shard's first copy,
/// and the growing server the shard moves to is in its chain, so that k copies stay once `me`
/// goes. (A copy that heads a shard after a loss never gives it up.)
inline bool moves_away(const chain_layout& layout, const roles& group, int me, int s) {
  const int to = group.grows_into(s);
  return to >= 0 && layout.position(s, me) == 0 && layout.position(s, to) >= 0 &&
         static_cast<int>(layout.chain(s).size()) > layout.replicas();
}

/// The answer to a request (`h`) for a shard this server gave up: status `shard_moved`,
/// naming the live servers that joined the shard, and where it went.
inline message moved_reply(const chain_layout& layout, const roles& group, response_header h) {
  const int s = static_cast<int>(h.shard);
  h.status = shard_moved;
  std::size_t n = 0;
  for (int j : layout.joined(s)) {
    if (n < h.joined.size() && !layout.gone(s, j)) h.joined[n++] = static_cast<std::uint32_t>(j) + 1;
  }
  const std::string text = "shard " + std::to_string(s) + " moved to server " + std::to_string(group.grows_into(s));
  return encode_response<char>(h, std::span<const char>(text.data(), text.size()));
}

/// Shard `s`'s live chain, head first: "1 -> 5".
inline std::string chain_text(const chain_layout& layout, int s) {
  std::string text;
  for (int member : layout.chain(s)) text += (text.empty() ? "" : " -> ") + std::to_string(member);
  return text;
}

}  // namespace dtrain::ps
