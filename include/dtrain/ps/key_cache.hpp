#pragma once
/// @file
/// Key caching (Li et al., OSDI 2014, section 3.5; `ps_options::key_cache_lists`), both halves:
/// a worker that sends a server the same sparse key list again sends a one-byte slot instead of
/// the keys, and the server applies the request through the table slots it resolved the first
/// time.
///  - `sent_key_lists` (worker): per server, the lists that server holds, least recently used
///    replaced first.
///  - `kept_key_lists` (server): per worker, the lists it asked to keep, checked once when kept,
///    and where their keys sit in the table they were used with.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/ps/protocol.hpp"
#include "dtrain/ps/sharding.hpp"

namespace dtrain::ps {

/// Where the keys of a list sit in one table, for a list that comes again (key caching): the
/// first operation given it fills it, later ones use it instead of looking the keys up. Valid
/// for the table that filled it, for the same keys, for the table's life (keys are never moved).
struct resolved_keys {
  std::vector<std::uint32_t> slots;
};

/// The worker's half: which key lists each shard's head holds, by slot.
class sent_key_lists {
 public:
  /// @param servers shards @param capacity lists kept per shard (at most 256: a slot is one byte)
  sent_key_lists(int servers, std::size_t capacity)
      : lists_(static_cast<std::size_t>(servers)), capacity_(std::min<std::size_t>(capacity, 256)) {}

  /// The slot of `keys` at `server`, and whether the server already holds them there; if not,
  /// they take a new slot or the least recently used one.
  std::pair<std::uint8_t, bool> slot_for(int server, std::span<const key_type> keys) {
    auto& lists = lists_[static_cast<std::size_t>(server)];
    std::size_t slot = 0;
    for (std::size_t i = 0; i < lists.size(); ++i) {
      if (lists[i].keys.size() == keys.size() && std::equal(keys.begin(), keys.end(), lists[i].keys.begin())) {
        lists[i].used = ++tick_;
        return {static_cast<std::uint8_t>(i), true};
      }
      if (lists[i].used < lists[slot].used) slot = i;
    }
    if (lists.size() < capacity_) {
      slot = lists.size();
      lists.emplace_back();
    }
    lists[slot].keys.assign(keys.begin(), keys.end());
    lists[slot].used = ++tick_;
    return {static_cast<std::uint8_t>(slot), false};
  }

  /// The shard has a new head, which holds none of the lists.
  void forget(int server) { lists_[static_cast<std::size_t>(server)].clear(); }

 private:
  struct sent {
    std::vector<key_type> keys;
    std::uint64_t used = 0;
  };
  std::vector<std::vector<sent>> lists_;  // per server, by slot
  std::size_t capacity_;
  std::uint64_t tick_ = 0;
};

/// A request's keys: in the request, or kept by the server (with their slots in the table).
struct key_list {
  std::span<const key_type> keys;
  resolved_keys* resolved = nullptr;
};

/// The server's half: the key lists each worker asked it to keep.
class kept_key_lists {
 public:
  explicit kept_key_lists(int workers) : lists_(static_cast<std::size_t>(workers)) {}

  /// A restarted worker starts with an empty cache.
  void forget(std::uint32_t worker) { lists_[worker].clear(); }

  /// The keys of a request with header `h` and keys `request_keys`: those keys, kept first when
  /// the request asks to (`key_cache::store`), or the kept list it names (`key_cache::use`).
  /// Push keys must be sorted and unique; a kept list is checked once, when kept.
  /// @throws dtrain::error `protocol_error` for a slot that does not hold what the request says
  key_list keys_of(const request_header& h, const std::vector<key_type>& request_keys) {
    const std::string who =
        std::string(h.what == op::pull ? "pull" : "push") + " from worker " + std::to_string(h.worker);
    if (h.cache == key_cache::none) {
      if (h.what != op::pull) check_sorted_unique(request_keys, who);
      return {request_keys, nullptr};
    }
    auto& mine = lists_[h.worker];
    if (mine.empty()) mine.resize(256);  // every slot a byte can name
    kept& c = mine[h.cache_slot];
    if (h.cache == key_cache::store) {
      c.keys.clear();  // a refused list leaves the slot empty, never holding an older list
      check_sorted_unique(request_keys, who);
      c.which = h.table;
      c.keys = request_keys;
      c.resolved.slots.clear();
    } else if (c.keys.size() != h.keys || c.which != h.table || h.keys == 0) {
      throw error(errc::protocol_error, who + " names key cache slot " + std::to_string(h.cache_slot) + " with " +
                                            std::to_string(h.keys) + " keys, but the slot holds " +
                                            std::to_string(c.keys.size()) + " keys of another table or request");
    }
    if (c.length != h.length) {  // resolved for another length: resolve again, checking each key's
      c.length = h.length;
      c.resolved.slots.clear();
    }
    return {c.keys, &c.resolved};
  }

 private:
  // A kept list, and where its keys sit in the table it was used with.
  struct kept {
    table_id which = table_id::sparse;
    std::uint32_t length = 0;  // values per key the slots were resolved (and checked) for
    std::vector<key_type> keys;
    resolved_keys resolved;
  };
  std::vector<std::vector<kept>> lists_;  // per worker, per slot
};

}  // namespace dtrain::ps
