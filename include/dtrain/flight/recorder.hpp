#pragma once
/// @file
/// The flight recorder: every collective call of the process, its last N kept in a ring, so that
/// a job that hangs, fails on one rank first or is killed leaves a record of which rank was in
/// which call, waiting on whom. Communicators record into `recorder::global()`; dumping it to a
/// file is `flight/dump.hpp`'s, and `dtrain-run --analyze` reads the files of a job.
///
/// Recording is always on (a dozen relaxed stores and two clock reads a call; measured in
/// docs/debugging.md). `DTRAIN_FLIGHT_RECORDER_SIZE=<n>` keeps the last n calls (default 2048;
/// 0 records nothing). Every field of a slot is an atomic, so a dump may read the ring from a
/// signal handler while other threads record: a slot overwritten during the read is skipped.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "dtrain/core/signature.hpp"

namespace dtrain::flight {

/// Where a recorded call stands.
enum class state : std::uint8_t {
  started,    ///< entered, not yet waiting on a message
  waiting,    ///< blocked on a send to or a receive from `peer`
  completed,  ///< returned
  failed,     ///< raised an error (the slot's note says which)
  withdrawn,  ///< a message cancelled before it matched: its number went to the next one
};

constexpr std::string_view state_name(state s) noexcept {
  switch (s) {
    case state::started: return "started";
    case state::waiting: return "waiting";
    case state::completed: return "completed";
    case state::failed: return "failed";
    case state::withdrawn: return "withdrawn";
  }
  return "unknown";
}

/// A copy of one recorded call, as a dump reads it.
struct call {
  std::uint64_t id = 0;      ///< the recorder's running number, from 1
  int rank = 0;              ///< the recording rank's world rank
  const char* group = "";    ///< the group's name ("world", "mesh:tp@dp0")
  int group_rank = 0;
  int group_size = 0;
  std::uint64_t tag = 0;     ///< the communicator's tag with its group's key: two communicators of one
                             ///< group, or two groups of one name, differ in it
  int generation = 0;        ///< communicators of this group and tag built before this one here
  signature sig{};           ///< operation, algorithm, dtype, count, root and sequence number
  state where = state::started;
  int peer = -1;             ///< world rank waited on (`waiting`), else the last one
  bool sending = false;      ///< whether that wait was a send
  std::int64_t start_us = 0;  ///< wall clock, microseconds since the epoch
  std::int64_t end_us = 0;    ///< 0 while the call runs
  const char* note = "";     ///< a failed call's error
};

/// The process's ring of recorded calls. Thread-safe; a call's slot is written by the thread
/// that runs the call.
class recorder {
  // Every field atomic: a dump reads slots while their threads write them.
  struct slot {
    std::atomic<std::uint64_t> id{0};
    std::atomic<int> rank{0}, group_rank{0}, group_size{0}, root{0}, peer{-1}, generation{0};
    std::atomic<const char*> group{""}, note{""};
    std::atomic<std::uint64_t> tag{0}, count{0}, seq{0};
    std::atomic<std::uint32_t> kind{0};
    std::atomic<state> where{state::started};
    std::atomic<bool> sending{false};
    std::atomic<std::int64_t> start_us{0}, end_us{0};
  };

 public:
  /// The process's recorder, sized by DTRAIN_FLIGHT_RECORDER_SIZE.
  static recorder& global() {
    static recorder instance(capacity_from_env());
    return instance;
  }

  explicit recorder(std::size_t capacity) : capacity_(capacity), slots_(std::make_unique<slot[]>(capacity)) {}
  recorder(const recorder&) = delete;
  recorder& operator=(const recorder&) = delete;

  bool enabled() const noexcept { return capacity_ > 0; }
  std::size_t capacity() const noexcept { return capacity_; }
  /// Calls recorded since the start (the ring keeps the last `capacity()`).
  std::uint64_t recorded() const noexcept { return next_.load(std::memory_order_relaxed) - 1; }

  /// What a communicator knows of its group when it records.
  struct group_info {
    const char* name;  // from `intern`: lives as long as the process
    int rank, size, world_rank;
    std::uint64_t tag;
    int generation = 0;
  };

  /// A handle on one recorded call: updates land only while its slot still holds it.
  class handle {
   public:
    handle() = default;
    /// The call now waits on world rank `peer`.
    void waiting(int peer, bool sending) const noexcept {
      if (!holds()) return;
      s_->peer.store(peer, std::memory_order_relaxed);
      s_->sending.store(sending, std::memory_order_relaxed);
      s_->where.store(state::waiting, std::memory_order_relaxed);
    }
    /// The wait is over; the call goes on.
    void resumed() const noexcept {
      if (holds()) s_->where.store(state::started, std::memory_order_relaxed);
    }
    void completed() const noexcept { finish(state::completed, nullptr); }
    /// `why` must live as long as the process (`intern` it).
    void failed(const char* why) const noexcept { finish(state::failed, why); }
    void withdrawn() const noexcept { finish(state::withdrawn, nullptr); }
    /// The call's sequence number becomes `seq` (a message whose predecessor was withdrawn).
    void renumber(std::uint64_t seq) const noexcept {
      if (holds()) s_->seq.store(seq, std::memory_order_relaxed);
    }
    std::uint64_t id() const noexcept { return id_; }

   private:
    friend recorder;
    handle(slot* s, std::uint64_t id) : s_(s), id_(id) {}
    bool holds() const noexcept { return s_ != nullptr && s_->id.load(std::memory_order_relaxed) == id_; }
    void finish(state st, const char* why) const noexcept {
      if (!holds()) return;
      if (why != nullptr) s_->note.store(why, std::memory_order_relaxed);
      s_->end_us.store(now_us(), std::memory_order_relaxed);
      s_->where.store(st, std::memory_order_release);
    }
    slot* s_ = nullptr;
    std::uint64_t id_ = 0;
  };

  /// Records that this thread enters the call `sig` of group `g`; a point-to-point operation
  /// names its `peer` (world rank) and whether it is `sending` from the start.
  handle start(const group_info& g, const signature& sig, int peer = -1, bool sending = false) noexcept {
    if (!enabled()) return {};
    const std::uint64_t id = next_.fetch_add(1, std::memory_order_relaxed);
    slot& s = slots_[id % capacity_];
    s.id.store(0, std::memory_order_relaxed);  // readers skip the slot while it is rewritten
    std::atomic_thread_fence(std::memory_order_release);
    s.rank.store(g.world_rank, std::memory_order_relaxed);
    s.group.store(g.name, std::memory_order_relaxed);
    s.group_rank.store(g.rank, std::memory_order_relaxed);
    s.group_size.store(g.size, std::memory_order_relaxed);
    s.tag.store(g.tag, std::memory_order_relaxed);
    s.generation.store(g.generation, std::memory_order_relaxed);
    s.kind.store(pack(sig), std::memory_order_relaxed);
    s.root.store(sig.root, std::memory_order_relaxed);
    s.count.store(sig.count, std::memory_order_relaxed);
    s.seq.store(sig.seq, std::memory_order_relaxed);
    s.where.store(state::started, std::memory_order_relaxed);
    s.peer.store(peer, std::memory_order_relaxed);
    s.sending.store(sending, std::memory_order_relaxed);
    s.start_us.store(now_us(), std::memory_order_relaxed);
    s.end_us.store(0, std::memory_order_relaxed);
    s.note.store("", std::memory_order_relaxed);
    s.id.store(id, std::memory_order_release);
    return {&s, id};
  }

  /// Calls `f(const call&)` for every call the ring holds, oldest first. Allocates nothing and
  /// takes no lock, so a signal handler may call it.
  template <class F>
  void for_each(F&& f) const {
    const std::uint64_t end = next_.load(std::memory_order_acquire);
    const std::uint64_t begin = end > capacity_ ? end - capacity_ : 1;
    for (std::uint64_t id = begin; id < end; ++id) {
      const slot& s = slots_[id % capacity_];
      if (s.id.load(std::memory_order_acquire) != id) continue;  // being written, or overwritten
      call c;
      c.id = id;
      c.rank = s.rank.load(std::memory_order_relaxed);
      c.group = s.group.load(std::memory_order_relaxed);
      c.group_rank = s.group_rank.load(std::memory_order_relaxed);
      c.group_size = s.group_size.load(std::memory_order_relaxed);
      c.tag = s.tag.load(std::memory_order_relaxed);
      c.generation = s.generation.load(std::memory_order_relaxed);
      c.sig = unpack(s.kind.load(std::memory_order_relaxed));
      c.sig.root = s.root.load(std::memory_order_relaxed);
      c.sig.count = s.count.load(std::memory_order_relaxed);
      c.sig.seq = s.seq.load(std::memory_order_relaxed);
      c.where = s.where.load(std::memory_order_acquire);
      c.peer = s.peer.load(std::memory_order_relaxed);
      c.sending = s.sending.load(std::memory_order_relaxed);
      c.start_us = s.start_us.load(std::memory_order_relaxed);
      c.end_us = s.end_us.load(std::memory_order_relaxed);
      c.note = s.note.load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (s.id.load(std::memory_order_relaxed) != id) continue;  // overwritten while read
      f(c);
    }
  }

  /// A copy of `text` that lives as long as the process: group names and errors are kept once
  /// each, so that slots hold plain pointers a signal handler can read.
  static const char* intern(std::string_view text) {
    static std::mutex m;
    static std::deque<std::string> kept;
    std::lock_guard lock(m);
    for (const auto& k : kept) {
      if (k == text) return k.c_str();
    }
    if (kept.size() >= max_interned) return "(more groups or errors than the flight recorder keeps)";
    return kept.emplace_back(text).c_str();
  }

  /// How many communicators of `g` (name, tag, world rank) this process built before: a
  /// communicator rebuilt after a failure starts its sequence numbers again, and the analysis must
  /// not take its calls for the old one's.
  static int generation_of(const group_info& g) {
    static std::mutex m;
    static std::deque<std::pair<group_info, int>> built;
    std::lock_guard lock(m);
    for (auto& [seen, count] : built) {
      if (seen.name == g.name && seen.tag == g.tag && seen.world_rank == g.world_rank) return ++count;
    }
    if (built.size() < max_interned) built.emplace_back(g, 0);
    return 0;
  }

  /// Wall-clock microseconds since the epoch: the ranks of one host line up.
  static std::int64_t now_us() noexcept {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

 private:
  static constexpr std::size_t default_capacity = 2048;
  static constexpr std::size_t max_interned = 4096;
  static constexpr std::size_t max_capacity = std::size_t{1} << 24;

  static std::uint32_t pack(const signature& s) noexcept {
    return static_cast<std::uint32_t>(s.op) | static_cast<std::uint32_t>(s.algo) << 8 |
           static_cast<std::uint32_t>(s.type) << 16 | static_cast<std::uint32_t>(s.redop) << 24;
  }
  static signature unpack(std::uint32_t k) noexcept {
    signature s;
    s.op = static_cast<coll_op>(k & 0xff);
    s.algo = static_cast<algorithm>(k >> 8 & 0xff);
    s.type = static_cast<dtype>(k >> 16 & 0xff);
    s.redop = static_cast<reduce_op>(k >> 24 & 0xff);
    return s;
  }

  static std::size_t capacity_from_env() {
    const char* v = std::getenv("DTRAIN_FLIGHT_RECORDER_SIZE");
    if (v == nullptr || *v == '\0') return default_capacity;
    char* end = nullptr;
    const unsigned long long n = std::strtoull(v, &end, 10);
    if (end == nullptr || *end != '\0' || *v == '-') {
      // A debugging aid never stops a job: say so and keep the default.
      std::fprintf(stderr, "dtrain warn: DTRAIN_FLIGHT_RECORDER_SIZE=%s is not a count of calls; keeping %zu\n", v,
                   default_capacity);
      return default_capacity;
    }
    return static_cast<std::size_t>(n < max_capacity ? n : max_capacity);
  }

  std::size_t capacity_;
  std::unique_ptr<slot[]> slots_;
  std::atomic<std::uint64_t> next_{1};
};

/// One call as it runs: marked failed if an exception leaves it before it completed or failed
/// (an error that is no `dtrain::error`, which nothing else records).
class scoped_call {
 public:
  explicit scoped_call(recorder::handle h) noexcept : handle_(h) {}
  scoped_call(const scoped_call&) = delete;
  scoped_call& operator=(const scoped_call&) = delete;
  ~scoped_call() {
    if (!done_) handle_.failed("left by an exception that is no dtrain::error");
  }
  const recorder::handle& handle() const noexcept { return handle_; }
  void completed() noexcept {
    done_ = true;
    handle_.completed();
  }
  /// `why` must live as long as the process (`recorder::intern` it).
  void failed(const char* why) noexcept {
    done_ = true;
    handle_.failed(why);
  }

 private:
  recorder::handle handle_;
  bool done_ = false;
};

/// The group a communicator over `t` records under: a process group's name, key and world ranks,
/// or "world". Counts nothing (`flight_group` does).
template <class Transport>
recorder::group_info group_of(const Transport& t, std::uint64_t tag) {
  recorder::group_info g{recorder::intern("world"), t.rank(), t.size(), t.rank(), tag};
  if constexpr (requires { t.name(); t.world_rank(); t.key(); }) {
    // Two groups may share a name ("pair" of ranks 0, 1 and of 2, 3); their keys differ.
    g = {recorder::intern(t.name()), t.rank(), t.size(), t.world_rank(), tag ^ t.key()};
  }
  return g;
}

/// `group_of(t, tag)`, counting the communicators of it built here before. Call it once per
/// communicator.
template <class Transport>
recorder::group_info flight_group(const Transport& t, std::uint64_t tag) {
  recorder::group_info g = group_of(t, tag);
  g.generation = recorder::generation_of(g);
  return g;
}

}  // namespace dtrain::flight
