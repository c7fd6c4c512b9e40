#pragma once
/// @file
/// Checkpoints of one parameter-server shard: its keys, values, updater state, per-worker clocks
/// and version, written atomically (a temporary file, fsync, rename, fsync of the directory), so
/// a crash leaves either the old checkpoint or the new one, never a torn file.
///
/// Format (little-endian): "DTRNCKPT", format version (u32), value bytes (u32), state slots
/// (u32), shard and shards (u32 each), version (u64), updater name and initializer name
/// (u32 length + bytes each), clock count (u32) + clocks (i64), key count (u64), then per key:
/// key (u64), length (u64), values, state; then an FNV-1a-64 checksum of everything before it.
/// Loading checks the checksum first, then that the checkpoint was written by the same kind of
/// shard, and says what differs.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/frame.hpp"
#include "dtrain/core/hash.hpp"
#include "dtrain/detail/checkpoint_io.hpp"
#include "dtrain/ps/table.hpp"

namespace dtrain::ps {

/// What a checkpoint records besides the table.
struct shard_state {
  std::uint32_t shard = 0, shards = 1;
  std::uint64_t version = 0;          ///< updates the shard has applied
  std::vector<std::int64_t> clocks;   ///< per worker: the last clock pushed
};

namespace detail {

inline constexpr char checkpoint_magic[8] = {'D', 'T', 'R', 'N', 'C', 'K', 'P', 'T'};
inline constexpr std::uint32_t checkpoint_format = 1;

}  // namespace detail

/// The file of shard `shard`'s checkpoint of `clock`: `<prefix>.shard<s>.c<clock>.<which>`.
inline std::string checkpoint_file(const std::string& prefix, int shard, std::int64_t clock, const char* which) {
  return prefix + ".shard" + std::to_string(shard) + ".c" + std::to_string(clock) + "." + which;
}

/// The newest clock for which every one of `shards` shards has both checkpoint files under
/// `prefix` (in one directory), or nothing.
inline std::optional<std::int64_t> latest_common_checkpoint(const std::string& prefix, int shards) {
  namespace fs = std::filesystem;
  const fs::path base(prefix);
  const fs::path dir = base.has_parent_path() ? base.parent_path() : fs::path(".");
  const std::string stem = base.filename().string() + ".shard";
  std::map<std::int64_t, int> complete;  // clock -> shards with both files
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const std::string suffix = ".dense";
    if (name.rfind(stem, 0) != 0 || name.size() <= suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    const auto dot_c = name.find(".c", stem.size());
    if (dot_c == std::string::npos) continue;
    const std::string shard_text = name.substr(stem.size(), dot_c - stem.size());
    const std::string clock_text = name.substr(dot_c + 2, name.size() - suffix.size() - dot_c - 2);
    char* end = nullptr;
    const long shard = std::strtol(shard_text.c_str(), &end, 10);
    if (shard_text.empty() || *end != '\0' || shard < 0 || shard >= shards) continue;
    const long long clock = std::strtoll(clock_text.c_str(), &end, 10);
    if (clock_text.empty() || *end != '\0') continue;
    if (fs::exists(checkpoint_file(prefix, static_cast<int>(shard), clock, "sparse"))) ++complete[clock];
  }
  std::optional<std::int64_t> best;
  for (const auto& [clock, n] : complete) {
    if (n == shards) best = clock;
  }
  return best;
}

/// Writes every key of `t`: key count (u64), then per key: key (u64), length (u64), values,
/// updater state. Checkpoints and a joining server's copy of a shard (ps/shard_transfer.hpp).
template <std::floating_point T, class Updater, class Initializer>
void write_table(dtrain::detail::byte_writer& w, table<T, Updater, Initializer>& t) {
  w.put(static_cast<std::uint64_t>(t.size()));
  t.for_each([&](key_type key, std::span<T> values, std::span<T> st) {
    w.put(key);
    w.put(static_cast<std::uint64_t>(values.size()));
    for (T v : values) w.put(v);
    for (T v : st) w.put(v);
  });
}

/// Reads what `write_table` wrote into the empty table `t`. @throws dtrain::error `bad_data`
/// naming `what` when it is truncated or a key is repeated
template <std::floating_point T, class Updater, class Initializer>
void read_table(dtrain::detail::byte_reader& r, table<T, Updater, Initializer>& t, const std::string& what) {
  const auto keys = r.get<std::uint64_t>();
  std::vector<T> values, state;
  for (std::uint64_t k = 0; k < keys; ++k) {
    const auto key = r.get<std::uint64_t>();
    const auto length = r.get<std::uint64_t>();
    if (length == 0 || length > r.remaining() / sizeof(T)) {
      throw error(errc::bad_data, what + " is truncated or has a key of absurd length");
    }
    values.resize(length);
    state.resize(length * Updater::state_slots);
    r.need((values.size() + state.size()) * sizeof(T));
    for (T& v : values) v = r.get<T>();
    for (T& v : state) v = r.get<T>();
    t.restore(key, values, state);
  }
}

/// Writes `t` and `state` to `path`, atomically. @throws dtrain::error with the system error
/// if the file cannot be written (the previous checkpoint, if any, is left in place).
template <std::floating_point T, class Updater, class Initializer>
void save_checkpoint(const std::string& path, table<T, Updater, Initializer>& t, const shard_state& state) {
  dtrain::detail::byte_writer w = dtrain::detail::checkpoint_writer(detail::checkpoint_magic);
  w.put(detail::checkpoint_format);
  w.put(static_cast<std::uint32_t>(sizeof(T)));
  w.put(static_cast<std::uint32_t>(Updater::state_slots));
  w.put(state.shard);
  w.put(state.shards);
  w.put(state.version);
  w.put(std::string_view(Updater::name));
  w.put(std::string_view(Initializer::name));
  w.put(static_cast<std::uint32_t>(state.clocks.size()));
  for (std::int64_t c : state.clocks) w.put(c);
  write_table(w, t);
  dtrain::detail::write_checkpoint(path, w);
}

/// Restores a checkpoint into the empty table `t`; returns the shard's clocks and version.
/// @param expected_shard, expected_shards the shard this server is
/// @throws dtrain::error `bad_data` naming the file and the fault: unreadable, not a dtrain
///   checkpoint, corrupt (checksum), truncated, or written by a different updater, value type,
///   initializer or shard; `invalid_argument` if `t` is not empty.
template <std::floating_point T, class Updater, class Initializer>
shard_state load_checkpoint(const std::string& path, table<T, Updater, Initializer>& t, std::uint32_t expected_shard,
                            std::uint32_t expected_shards) {
  if (t.size() != 0) throw error(errc::invalid_argument, "load_checkpoint: the table is not empty");
  const auto body = dtrain::detail::read_checkpoint(path, detail::checkpoint_magic, "checkpoint");
  auto bad = [&](const std::string& what) { return error(errc::bad_data, "checkpoint " + path + " " + what); };
  dtrain::detail::byte_reader r(body, "checkpoint " + path);
  if (const auto f = r.get<std::uint32_t>(); f != detail::checkpoint_format) {
    throw bad("has format " + std::to_string(f) + "; this build reads format " +
              std::to_string(detail::checkpoint_format));
  }
  const auto value_bytes = r.get<std::uint32_t>();
  const auto slots = r.get<std::uint32_t>();
  shard_state s;
  s.shard = r.get<std::uint32_t>();
  s.shards = r.get<std::uint32_t>();
  s.version = r.get<std::uint64_t>();
  const std::string updater_name = r.get_string(), init_name = r.get_string();
  if (updater_name != Updater::name || slots != Updater::state_slots || value_bytes != sizeof(T)) {
    throw bad("was written by updater " + updater_name + " (" + std::to_string(slots) + " state slots, " +
              std::to_string(value_bytes) + "-byte values); this server runs " + std::string(Updater::name) + " (" +
              std::to_string(Updater::state_slots) + " slots, " + std::to_string(sizeof(T)) + "-byte values)");
  }
  if (init_name != Initializer::name) {
    throw bad("was written with the " + init_name + " initializer; this server uses " + std::string(Initializer::name));
  }
  if (s.shard != expected_shard || s.shards != expected_shards) {
    throw bad("belongs to shard " + std::to_string(s.shard) + " of " + std::to_string(s.shards) + ", not shard " +
              std::to_string(expected_shard) + " of " + std::to_string(expected_shards));
  }
  const auto clocks = r.get<std::uint32_t>();
  r.need(static_cast<std::size_t>(clocks) * 8);
  for (std::uint32_t i = 0; i < clocks; ++i) s.clocks.push_back(r.get<std::int64_t>());
  read_table(r, t, "checkpoint " + path);
  if (r.remaining() != 0) throw bad("has " + std::to_string(r.remaining()) + " bytes after its last key");
  return s;
}

}  // namespace dtrain::ps
