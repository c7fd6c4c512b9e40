#pragma once
/// @file
/// Which parameter-server shard owns each key. Keys are `std::uint64_t`.
///
/// - `range_sharding`: server i owns [floor(i·K/S), floor((i+1)·K/S)) of a key space of K keys,
///   computed in 128-bit arithmetic so the ranges cover the key space exactly, for any S (ps-lite
///   lost keys when 2^64 did not divide evenly, its issue #185).
/// - `consistent_hash_sharding`: each server holds `virtual_nodes` points on a hash ring; a key
///   belongs to the first point at or after its hash. Adding a server moves only the keys of
///   its new arcs (about 1/(S+1) of them).
///
/// `partition_keys` groups a request's sorted, unique keys by server, keeping their order;
/// `for_each_server_share` hands each server its share of them.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/concepts/sharding.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/hash.hpp"

namespace dtrain::ps {

namespace detail {
__extension__ typedef unsigned __int128 uint128;  // GCC and Clang; exact range arithmetic

inline void check_servers(int servers, const char* who) {
  if (servers < 1) {
    throw error(errc::invalid_argument, std::string(who) + ": " + std::to_string(servers) + " servers");
  }
}
}  // namespace detail

/// Contiguous key ranges whose sizes differ by at most one key. A model of `sharding`.
class range_sharding {
 public:
  /// @param servers shards, >= 1
  /// @param key_space keys [0, key_space); 0 means the whole 64-bit space
  /// @throws dtrain::error `invalid_argument` if servers < 1 or more servers than keys
  explicit range_sharding(int servers, key_type key_space = 0) : servers_(servers), key_space_(key_space) {
    detail::check_servers(servers, "range_sharding");
    const detail::uint128 k = size();
    if (k < static_cast<detail::uint128>(servers)) {
      throw error(errc::invalid_argument, "range_sharding: " + std::to_string(servers) + " servers for " +
                                              std::to_string(key_space) + " keys");
    }
    // The first key of servers 1..S-1, as 64-bit keys: a lookup is a short binary search, with
    // no 128-bit division per key (which cost as much as the rest of a sparse push).
    for (int i = 1; i < servers_; ++i) firsts_.push_back(static_cast<key_type>(begin(i)));
  }

  int servers() const noexcept { return servers_; }
  bool contains(key_type k) const noexcept { return key_space_ == 0 || k < key_space_; }

  /// The first key of server i's range; `begin(servers())` is one past the last key (as 128 bits).
  detail::uint128 begin(int i) const noexcept {
    return size() * static_cast<detail::uint128>(i) / static_cast<detail::uint128>(servers_);
  }

  /// @pre contains(k)
  int server_of(key_type k) const noexcept {
    return static_cast<int>(std::upper_bound(firsts_.begin(), firsts_.end(), k) - firsts_.begin());
  }

  /// For sorted keys, each server's keys are one run: server s has [cuts[s], cuts[s + 1]).
  /// S binary searches instead of a lookup per key.
  std::vector<std::size_t> split_sorted(std::span<const key_type> keys) const {
    std::vector<std::size_t> cuts(static_cast<std::size_t>(servers_) + 1, keys.size());
    cuts[0] = 0;
    for (std::size_t i = 0; i < firsts_.size(); ++i) {
      cuts[i + 1] = static_cast<std::size_t>(std::lower_bound(keys.begin(), keys.end(), firsts_[i]) - keys.begin());
    }
    return cuts;
  }

 private:
  detail::uint128 size() const noexcept {
    return key_space_ == 0 ? (detail::uint128{1} << 64) : detail::uint128{key_space_};
  }

  int servers_;
  key_type key_space_;
  std::vector<key_type> firsts_;
};

/// Consistent hashing with virtual nodes. A model of `sharding`.
class consistent_hash_sharding {
 public:
  /// @param servers shards, >= 1  @param virtual_nodes points per server on the ring
  /// @param seed changes the ring (every process must use the same)
  explicit consistent_hash_sharding(int servers, int virtual_nodes = 128, std::uint64_t seed = 0)
      : servers_(servers) {
    detail::check_servers(servers, "consistent_hash_sharding");
    if (virtual_nodes < 1) throw error(errc::invalid_argument, "consistent_hash_sharding: virtual_nodes < 1");
    ring_.reserve(static_cast<std::size_t>(servers) * static_cast<std::size_t>(virtual_nodes));
    for (int s = 0; s < servers; ++s) {
      for (int v = 0; v < virtual_nodes; ++v) {
        // A point depends only on (seed, server, node), so adding a server keeps the others'.
        const std::uint64_t point =
            splitmix64(seed ^ splitmix64((static_cast<std::uint64_t>(s) << 32) | static_cast<std::uint32_t>(v)));
        ring_.emplace_back(point, s);
      }
    }
    std::sort(ring_.begin(), ring_.end());
    seed_ = seed;
  }

  int servers() const noexcept { return servers_; }
  bool contains(key_type) const noexcept { return true; }

  int server_of(key_type k) const noexcept {
    const std::uint64_t h = splitmix64(k ^ splitmix64(seed_ + 1));
    auto it = std::lower_bound(ring_.begin(), ring_.end(), std::pair<std::uint64_t, int>(h, -1));
    return it == ring_.end() ? ring_.front().second : it->second;
  }

 private:
  int servers_;
  std::uint64_t seed_ = 0;
  std::vector<std::pair<std::uint64_t, int>> ring_;
};

static_assert(sharding<range_sharding> && sharding<consistent_hash_sharding>);

/// A request's keys grouped by server: server s's keys are
/// `keys[order[i]]` for i in [offsets[s], offsets[s + 1]), in ascending key order.
struct key_partition {
  std::vector<std::size_t> offsets;  ///< servers() + 1 entries
  std::vector<std::uint32_t> order;  ///< positions into the request's keys
  /// Positions of server s's keys.
  std::span<const std::uint32_t> of(int s) const noexcept {
    return std::span(order).subspan(offsets[static_cast<std::size_t>(s)],
                                    offsets[static_cast<std::size_t>(s) + 1] - offsets[static_cast<std::size_t>(s)]);
  }
};

namespace detail {
inline error out_of_order(std::span<const key_type> keys, std::size_t i, const std::string& who) {
  return error(errc::invalid_argument, who + ": keys must be sorted and unique; key " + std::to_string(keys[i]) +
                                           " at position " + std::to_string(i) + " follows " +
                                           std::to_string(keys[i - 1]));
}
}  // namespace detail

/// Checks that `keys` are strictly ascending (sorted and unique); `who` opens the message.
/// @throws dtrain::error `invalid_argument` naming the first offending position and key
inline void check_sorted_unique(std::span<const key_type> keys, const std::string& who) {
  for (std::size_t i = 1; i < keys.size(); ++i) {
    if (keys[i] <= keys[i - 1]) throw detail::out_of_order(keys, i, who);
  }
}

/// Checks that `keys` are strictly ascending (sorted, unique) and inside the key space.
/// @throws dtrain::error `invalid_argument` naming the first offending position and key
template <sharding S>
void check_keys(const S& s, std::span<const key_type> keys) {
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (i > 0 && keys[i] <= keys[i - 1]) throw detail::out_of_order(keys, i, "ps");
    if (!s.contains(keys[i])) {
      throw error(errc::invalid_argument, "ps: key " + std::to_string(keys[i]) + " at position " + std::to_string(i) +
                                              " is outside the key space");
    }
  }
  if (keys.size() > std::numeric_limits<std::uint32_t>::max()) {
    throw error(errc::invalid_argument, "ps: more than 2^32 keys in one request");
  }
}

/// Groups `keys` by owning server (counting sort: two passes, no per-key allocation).
/// @throws dtrain::error as `check_keys`
template <sharding S>
key_partition partition_keys(const S& s, std::span<const key_type> keys) {
  check_keys(s, keys);
  const auto servers = static_cast<std::size_t>(s.servers());
  key_partition p;
  p.offsets.assign(servers + 1, 0);
  std::vector<int> owner(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    owner[i] = s.server_of(keys[i]);
    ++p.offsets[static_cast<std::size_t>(owner[i]) + 1];
  }
  for (std::size_t k = 0; k < servers; ++k) p.offsets[k + 1] += p.offsets[k];
  p.order.resize(keys.size());
  std::vector<std::size_t> next(p.offsets.begin(), p.offsets.end() - 1);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    p.order[next[static_cast<std::size_t>(owner[i])]++] = static_cast<std::uint32_t>(i);
  }
  return p;
}

/// One slice of a dense tensor: `count` elements from `offset`, held by `server`.
struct dense_slice {
  std::size_t tensor = 0, offset = 0, count = 0;
  key_type key = 0;  ///< the slice's id: the key its server stores it under
  int server = 0;
};

/// Calls `f(server, its keys, first, positions)` for every server that owns some of the sorted,
/// unique `keys`, in server order. With a sharding that splits sorted keys into runs
/// (`range_sharding`) a server's keys are the run keys[first, first + n), found by binary search,
/// and `positions` is empty; otherwise they are gathered (into a buffer reused between calls)
/// and `positions` holds their indices in `keys`.
/// @throws dtrain::error as `check_keys`, before any call
template <sharding S, class F>
void for_each_server_share(const S& s, std::span<const key_type> keys, F&& f) {
  if constexpr (requires(std::span<const key_type> k) { s.split_sorted(k); }) {
    check_keys(s, keys);
    const auto cuts = s.split_sorted(keys);
    for (int i = 0; i < s.servers(); ++i) {
      const std::size_t a = cuts[static_cast<std::size_t>(i)], n = cuts[static_cast<std::size_t>(i) + 1] - a;
      if (n > 0) f(i, keys.subspan(a, n), a, std::span<const std::uint32_t>{});
    }
  } else {
    const auto parts = partition_keys(s, keys);
    std::vector<key_type> mine;
    for (int i = 0; i < s.servers(); ++i) {
      const auto positions = parts.of(i);
      if (positions.empty()) continue;
      mine.resize(positions.size());
      for (std::size_t j = 0; j < positions.size(); ++j) mine[j] = keys[positions[j]];
      f(i, std::span<const key_type>(mine), std::size_t{0}, positions);
    }
  }
}

/// Dense tensors cut into slices of at most `slice_bytes` (BytePS: about 4 MB), each placed on
/// a server by the sharding of its slice id, so one large tensor spreads across all servers.
class dense_layout {
 public:
  /// @param slice_bytes largest slice  @param element_bytes size of one value
  dense_layout(std::size_t slice_bytes, std::size_t element_bytes)
      : slice_elements_(std::max<std::size_t>(1, slice_bytes / std::max<std::size_t>(1, element_bytes))) {}

  /// Adds a tensor of `elements` values; returns its index. Slices are placed by `s`.
  template <sharding S>
  std::size_t add_tensor(std::size_t elements, const S& s) {
    const std::size_t t = tensor_sizes_.size();
    tensor_sizes_.push_back(elements);
    first_slice_.push_back(slices_.size());
    for (std::size_t at = 0; at < elements; at += slice_elements_) {
      dense_slice d;
      d.tensor = t;
      d.offset = at;
      d.count = std::min(slice_elements_, elements - at);
      d.key = static_cast<key_type>(slices_.size());
      if (!s.contains(d.key)) throw error(errc::invalid_argument, "dense_layout: more slices than the key space");
      d.server = s.server_of(d.key);
      slices_.push_back(d);
    }
    return t;
  }

  const std::vector<dense_slice>& slices() const noexcept { return slices_; }
  /// Tensor t's slices: [first, last) of `slices()`.
  std::pair<std::size_t, std::size_t> slices_of(std::size_t t) const noexcept {
    return {first_slice_[t], t + 1 < first_slice_.size() ? first_slice_[t + 1] : slices_.size()};
  }
  std::size_t tensor_size(std::size_t t) const noexcept { return tensor_sizes_[t]; }
  std::size_t tensors() const noexcept { return tensor_sizes_.size(); }
  std::size_t slice_elements() const noexcept { return slice_elements_; }

 private:
  std::size_t slice_elements_;
  std::vector<std::size_t> tensor_sizes_, first_slice_;
  std::vector<dense_slice> slices_;
};

}  // namespace dtrain::ps
