#pragma once
/// @file
/// An optional timeline of compute and communication, written as a Chrome trace (JSON) that
/// Perfetto (ui.perfetto.dev) and chrome://tracing read.
///
/// Set `DTRAIN_TRACE=<prefix>` and every process writes `<prefix>.<rank>.json` when it exits (or
/// when `trace::recorder::global().flush()` is called). Each rank is a process in the viewer and
/// each thread a track, so a trainer's overlap of backward and bucket allreduces is visible.
/// `python3 tools/merge_traces.py <prefix>` joins the files of one job into one timeline.
/// Unset, every trace call is one predictable branch.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dtrain::trace {

/// Collects the complete events ("ph":"X") of one process. Thread-safe.
class recorder {
 public:
  using clock = std::chrono::steady_clock;

  /// The process's recorder, enabled iff DTRAIN_TRACE is set and not empty.
  static recorder& global() {
    static recorder instance(std::getenv("DTRAIN_TRACE"));
    return instance;
  }

  /// A recorder writing to `<prefix>.<rank>.json`; null or empty: disabled.
  explicit recorder(const char* prefix) : prefix_(prefix == nullptr ? "" : prefix) {
    // Timestamps are wall-clock microseconds, so the ranks of one machine line up when merged;
    // durations come from the steady clock.
    origin_steady_ = clock::now();
    origin_wall_us_ = std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  }
  recorder(const recorder&) = delete;
  recorder& operator=(const recorder&) = delete;
  ~recorder() { flush(); }

  bool enabled() const noexcept { return !prefix_.empty(); }

  /// Names this process in the timeline ("rank 3") and picks its file name.
  void set_rank(int rank) {
    std::lock_guard lock(mutex_);
    rank_ = rank;
  }

  /// Names the calling thread's track ("compute", "communication").
  void name_thread(std::string_view name) {
    if (!enabled()) return;
    std::lock_guard lock(mutex_);
    thread_names_.emplace_back(thread_id(), std::string(name));
  }

  /// Records that `name` ran on the calling thread from `begin` to `end`.
  void complete(std::string_view name, std::string_view category, clock::time_point begin,
                clock::time_point end) {
    if (!enabled()) return;
    const int tid = thread_id();
    std::lock_guard lock(mutex_);
    if (events_.size() >= max_events) {
      ++dropped_;
      return;
    }
    events_.push_back({std::string(name), std::string(category), micros(begin), micros(end) - micros(begin), tid});
  }

  /// Writes every event so far to `<prefix>.<rank>.json` (replacing it). Returns false, with a
  /// line on stderr, if the file cannot be written; tracing never fails the program.
  bool flush() {
    if (!enabled()) return true;
    std::lock_guard lock(mutex_);
    const std::string path = prefix_ + "." + std::to_string(rank_) + ".json";
    std::FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "dtrain: cannot write the trace %s\n", path.c_str());
      return false;
    }
    std::fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
    std::fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}}", rank_,
                 rank_);
    for (const auto& [tid, name] : thread_names_) {
      std::fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}}",
                   rank_, tid, escaped(name).c_str());
    }
    for (const auto& e : events_) {
      std::fprintf(f, ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%lld,\"dur\":%lld,\"pid\":%d,\"tid\":%d}",
                   escaped(e.name).c_str(), escaped(e.category).c_str(), static_cast<long long>(e.ts),
                   static_cast<long long>(e.dur), rank_, e.tid);
    }
    std::fprintf(f, "\n],\"otherData\":{\"dropped_events\":%zu}}\n", dropped_);
    const bool ok = std::fclose(f) == 0;
    if (!ok) std::fprintf(stderr, "dtrain: cannot write the trace %s\n", path.c_str());
    return ok;
  }

  /// One recorded event: microseconds since the epoch (wall clock) and the thread's track.
  struct event {
    std::string name, category;
    std::int64_t ts, dur;
    int tid;
  };

  /// Events recorded so far (tests, tools).
  std::size_t size() const {
    std::lock_guard lock(mutex_);
    return events_.size();
  }

  /// A copy of the events recorded so far.
  std::vector<event> events() const {
    std::lock_guard lock(mutex_);
    return events_;
  }

  /// Beyond this many events a process records no more (and says how many it dropped).
  static constexpr std::size_t max_events = std::size_t{1} << 21;

 private:
  std::int64_t micros(clock::time_point t) const noexcept {
    return origin_wall_us_ + std::chrono::duration_cast<std::chrono::microseconds>(t - origin_steady_).count();
  }

  static int thread_id() noexcept {
    static std::atomic<int> next{1};
    thread_local const int id = next.fetch_add(1);
    return id;
  }

  static std::string escaped(std::string_view s) {
    std::string out;
    for (char c : s) {
      if (c == '"' || c == '\\') out += '\\';
      out += static_cast<unsigned char>(c) < 0x20 ? ' ' : c;
    }
    return out;
  }

  std::string prefix_;
  clock::time_point origin_steady_;
  std::int64_t origin_wall_us_ = 0;
  mutable std::mutex mutex_;
  int rank_ = 0;
  std::vector<event> events_;
  std::vector<std::pair<int, std::string>> thread_names_;
  std::size_t dropped_ = 0;
};

/// Records the lifetime of a scope as one event on the calling thread's track.
class scope {
 public:
  /// `name` and `category` must outlive the scope (string literals, usually).
  scope(std::string_view name, std::string_view category, recorder& r = recorder::global()) noexcept
      : recorder_(r.enabled() ? &r : nullptr), name_(name), category_(category) {
    if (recorder_ != nullptr) begin_ = recorder::clock::now();
  }
  scope(const scope&) = delete;
  scope& operator=(const scope&) = delete;
  ~scope() {
    if (recorder_ == nullptr) return;
    try {
      recorder_->complete(name_, category_, begin_, recorder::clock::now());
    } catch (...) {  // out of memory while tracing: lose the event, not the program
    }
  }

 private:
  recorder* recorder_;
  std::string_view name_, category_;
  recorder::clock::time_point begin_{};
};

}  // namespace dtrain::trace
