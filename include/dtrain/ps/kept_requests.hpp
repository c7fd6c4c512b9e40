#pragma once
/// @file
/// `ps::kept_requests`: the messages a server keeps back until news it has not seen yet lets it
/// handle them (a loss a worker saw first, a shard's state, a shard moving away), in the order
/// each sender sent them: one kept message holds back everything its sender sent after it.

#include <chrono>
#include <cstddef>
#include <deque>
#include <set>
#include <utility>
#include <vector>

namespace dtrain::ps {

class kept_requests {
 public:
  using clock = std::chrono::steady_clock;

  void keep(int from, std::vector<std::byte> bytes) { kept_.push_back({from, std::move(bytes), clock::now()}); }
  bool empty() const noexcept { return kept_.empty(); }
  /// Whether a message from `sender` is kept (so its next ones must be too).
  bool holds_from(int sender) const {
    for (const entry& k : kept_) {
      if (k.from == sender) return true;
    }
    return false;
  }

  /// Offers each kept message, oldest first, to `handle(from, bytes, overdue)`, which @returns
  /// whether it handled it; `overdue` says it has waited `timeout`. What is not handled stays,
  /// and so does everything its sender sent after it.
  template <class Handle>
  void retry(std::chrono::milliseconds timeout, Handle&& handle) {
    if (kept_.empty()) return;
    std::deque<entry> again;
    again.swap(kept_);
    std::set<int> blocked;
    for (entry& k : again) {
      if (blocked.count(k.from) != 0 || !handle(k.from, k.bytes, clock::now() - k.since >= timeout)) {
        blocked.insert(k.from);
        kept_.push_back(std::move(k));
      }
    }
  }

 private:
  struct entry {
    int from;
    std::vector<std::byte> bytes;
    clock::time_point since;
  };
  std::deque<entry> kept_;
};

}  // namespace dtrain::ps
