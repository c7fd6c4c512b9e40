#pragma once
/// @file
/// Writing the flight recorder to a file per process: `<DTRAIN_FLIGHT_DIR>/flight.<rank>.txt`.
///
/// With DTRAIN_FLIGHT_DIR set (dtrain-run sets it for every rank), a process dumps its ring when
/// a collective times out, loses a peer or finds a mismatch; on a fatal signal (SIGSEGV, SIGBUS,
/// SIGFPE, SIGILL, SIGABRT, so an uncaught exception too) and on SIGTERM, before the signal does
/// what it did before; on `dump_signal` (SIGUSR2), going on afterwards; at exit; and when
/// `dtrain::flight::dump()` is called. Each dump replaces the last (written aside, then renamed).
/// Its first dump, empty, comes when the first communicator is built: a launcher sends the dump
/// signal only to processes that have one, since the signal ends a process that has no handler.
/// Unset, nothing is written and no handler installed; `dump()` still writes to a path given.
///
/// The writer allocates nothing and calls only async-signal-safe functions (open, write,
/// rename, close), so the dump a signal asks for is the same as any other.

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "dtrain/flight/recorder.hpp"

namespace dtrain::flight {

/// The signal that asks a process for a dump and lets it go on.
inline constexpr int dump_signal = SIGUSR2;

namespace detail {

// Writes `v` in decimal at `out` (room for 20 digits). @returns the digits written.
inline std::size_t decimal(std::uint64_t v, char* out) noexcept {
  char digits[24];
  std::size_t n = 0;
  do {
    digits[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0);
  for (std::size_t i = 0; i < n; ++i) out[i] = digits[n - 1 - i];
  return n;
}

// Text into a fixed buffer, written out as it fills: no allocation, no stdio.
class signal_safe_writer {
 public:
  explicit signal_safe_writer(int fd) : fd_(fd) {}
  ~signal_safe_writer() { flush(); }

  signal_safe_writer& operator<<(std::string_view s) {
    for (char c : s) put(c);
    return *this;
  }
  signal_safe_writer& operator<<(char c) {
    put(c);
    return *this;
  }
  signal_safe_writer& operator<<(std::uint64_t u) {
    char digits[24];
    return *this << std::string_view(digits, decimal(u, digits));
  }
  signal_safe_writer& operator<<(std::int64_t v) {
    if (v < 0) put('-');
    return *this << (v < 0 ? 0 - static_cast<std::uint64_t>(v) : static_cast<std::uint64_t>(v));
  }
  signal_safe_writer& operator<<(int v) { return *this << static_cast<std::int64_t>(v); }
  /// Text that stays on its line: line breaks written as spaces.
  void text(const char* s) {
    for (; s != nullptr && *s != '\0'; ++s) put(*s == '\n' || *s == '\r' ? ' ' : *s);
  }
  /// A word (a group name): spaces written as '_' too.
  void word(const char* s) {
    for (; s != nullptr && *s != '\0'; ++s) put(*s == ' ' || *s == '\n' || *s == '\r' ? '_' : *s);
  }
  bool flush() {
    for (std::size_t at = 0; at < used_;) {
      const ssize_t n = ::write(fd_, buf_ + at, used_ - at);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ok_ = false;
        break;
      }
      at += static_cast<std::size_t>(n);
    }
    used_ = 0;
    return ok_;
  }

 private:
  void put(char c) {
    if (used_ == sizeof buf_) flush();
    buf_[used_++] = c;
  }
  int fd_;
  char buf_[4096];
  std::size_t used_ = 0;
  bool ok_ = true;
};

// The lines of one dump (docs/debugging.md describes them).
inline void write_dump(signal_safe_writer& w, const recorder& r, int rank, const char* reason, const char* first) {
  w << "dtrain flight recorder 1\n";
  w << "rank " << rank << '\n' << "pid " << static_cast<int>(::getpid()) << '\n';
  w << "dumped_us " << recorder::now_us() << '\n';
  w << "reason ";
  w.text(reason);
  w << "\nfirst ";
  w.text(first);
  w << '\n';
  w << "capacity " << static_cast<std::uint64_t>(r.capacity()) << '\n' << "recorded " << r.recorded() << '\n';
  r.for_each([&](const call& c) {
    w << "call id=" << c.id << " rank=" << c.rank << " group=";
    w.word(c.group);
    w << " grank=" << c.group_rank << " gsize=" << c.group_size << " tag=" << c.tag << " gen=" << c.generation
      << " seq=" << c.sig.seq;
    w << " op=" << coll_op_name(c.sig.op) << " algo=" << algorithm_name(c.sig.algo)
      << " dtype=" << dtype_name(c.sig.type) << " redop=" << reduce_op_name(c.sig.redop) << " root=" << c.sig.root
      << " count=" << c.sig.count << " state=" << state_name(c.where) << " peer=" << c.peer
      << " dir=" << (c.sending ? "send" : "recv") << " start_us=" << c.start_us << " end_us=" << c.end_us;
    w << " note=";  // last: the rest of the line
    w.text(c.note);
    w << '\n';
  });
}

}  // namespace detail

/// Where and when the process dumps its recorder. One per process (`global()`).
class dumper {
 public:
  /// Reads DTRAIN_FLIGHT_DIR and the rank (DTRAIN_RANK, RANK, OMPI_COMM_WORLD_RANK, PMI_RANK,
  /// SLURM_PROCID), and installs the signal handlers when the directory is set.
  static dumper& global() {
    static dumper instance;
    return instance;
  }

  dumper(const dumper&) = delete;
  dumper& operator=(const dumper&) = delete;
  ~dumper() {
    live().store(nullptr);  // a signal from now on finds no dumper
    if (!dir_.empty()) dump_to_dir("exit");
  }

  /// The directory dumps go to; empty: none.
  const std::string& directory() const noexcept { return dir_; }
  /// The file this process dumps to; empty without a directory.
  std::string path() const {
    char p[4096];
    return !dir_.empty() && name_into(p, false) ? std::string(p) : std::string();
  }

  /// The process's world rank, from the launcher's environment or `set_rank`; -1 if unknown.
  int rank() const noexcept { return rank_.load(); }

  /// Names the file by world rank when the launcher's environment did not (first caller wins).
  void set_rank(int world_rank) noexcept {
    int unknown = -1;
    rank_.compare_exchange_strong(unknown, world_rank);
  }

  /// Keeps the first thing that went wrong, for every later dump's `first` line.
  void note(const char* what) noexcept {
    const char* none = nullptr;
    first_.compare_exchange_strong(none, what);
  }

  /// Dumps to the directory, if there is one. Async-signal-safe. @returns whether a file was written.
  bool dump_to_dir(const char* reason) const noexcept {
    if (dir_.empty()) return false;
    char final_path[4096], temp_path[4096];
    if (!name_into(final_path, false) || !name_into(temp_path, true)) return false;
    return write_file(temp_path, final_path, reason);
  }

  /// Dumps to `file` (replaced). Async-signal-safe. @returns whether it was written.
  bool dump_to(const char* file, const char* reason) const noexcept {
    char temp_path[4096];
    const std::size_t n = std::strlen(file);
    if (n + 32 > sizeof temp_path) return false;
    std::memcpy(temp_path, file, n);
    std::size_t at = n;
    temp_path[at++] = '.';
    at += detail::decimal(next_temp_.fetch_add(1), temp_path + at);
    std::memcpy(temp_path + at, ".tmp", 5);
    return write_file(temp_path, file, reason);
  }

 private:
  dumper() {
    const char* dir = std::getenv("DTRAIN_FLIGHT_DIR");
    if (dir != nullptr) dir_ = dir;
    while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
    for (const char* name : {"DTRAIN_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}) {
      const char* v = std::getenv(name);
      if (v == nullptr || *v == '\0') continue;
      char* end = nullptr;
      const long r = std::strtol(v, &end, 10);
      if (*end == '\0' && r >= 0 && r < (1 << 30)) rank_ = static_cast<int>(r);
      break;
    }
    (void)recorder::global();  // first: it outlives this dumper, which dumps it at exit
    if (dir_.empty()) return;
    live().store(this);  // before the handlers: a signal during construction must not construct it again
    install_handlers();
    // An empty dump says to the launcher that this process answers the dump signal.
    dump_to_dir("started");
  }

  // `<dir>/flight.<rank>.txt` (or `flight.pid<pid>`), or a temporary name for it that no other
  // dump shares (two may run at once: a thread's error and a signal) and that no reader takes for
  // a dump (`.flight.<rank>.<n>.tmp`), built without allocating.
  bool name_into(char (&out)[4096], bool temporary) const noexcept {
    std::size_t n = 0;
    auto add = [&](std::string_view s) {
      for (char c : s) {
        if (n + 1 >= sizeof out) return false;
        out[n++] = c;
      }
      return true;
    };
    auto add_number = [&](unsigned long v) {
      char digits[24];
      return add(std::string_view(digits, detail::decimal(v, digits)));
    };
    const int r = rank_.load();
    bool ok = add(dir_) && add(temporary ? "/.flight." : "/flight.");
    ok = ok && (r >= 0 ? add_number(static_cast<unsigned long>(r))
                       : add("pid") && add_number(static_cast<unsigned long>(::getpid())));
    ok = ok && (temporary ? add(".") && add_number(next_temp_.fetch_add(1)) && add(".tmp") : add(".txt"));
    out[n] = '\0';
    return ok;
  }

  bool write_file(const char* temp_path, const char* final_path, const char* reason) const noexcept {
    const int fd = ::open(temp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return false;
    bool ok;
    {
      detail::signal_safe_writer w(fd);
      const char* first = first_.load();
      detail::write_dump(w, recorder::global(), rank_.load(), reason, first == nullptr ? reason : first);
      ok = w.flush();
    }
    ok = ::close(fd) == 0 && ok;
    return ok && ::rename(temp_path, final_path) == 0;
  }

  static constexpr int handled[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTERM, dump_signal};

  static const char* signal_reason(int sig) noexcept {
    switch (sig) {
      case SIGSEGV: return "signal SIGSEGV";
      case SIGBUS: return "signal SIGBUS";
      case SIGFPE: return "signal SIGFPE";
      case SIGILL: return "signal SIGILL";
      case SIGABRT: return "signal SIGABRT";
      case SIGTERM: return "signal SIGTERM";
      default: return "asked (SIGUSR2)";
    }
  }

  static std::atomic<dumper*>& live() noexcept {
    static std::atomic<dumper*> the_dumper{nullptr};
    return the_dumper;
  }

  static struct sigaction& previous(int sig) noexcept {
    static struct sigaction saved[64];
    return saved[sig & 63];
  }

  static void on_signal(int sig, siginfo_t* info, void* context) {
    const int saved_errno = errno;
    if (dumper* self = live().load()) {
      if (sig != dump_signal) self->note(signal_reason(sig));
      self->dump_to_dir(signal_reason(sig));
    }
    const struct sigaction& old = previous(sig);
    if (old.sa_flags & SA_SIGINFO) {
      if (old.sa_sigaction != nullptr) old.sa_sigaction(sig, info, context);
    } else if (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN) {
      old.sa_handler(sig);
    } else if (sig != dump_signal && old.sa_handler == SIG_DFL) {
      // Back to what the signal did before; raised again, it acts once this handler returns (a
      // fault re-executes its instruction, and faults again).
      ::sigaction(sig, &old, nullptr);
      if (info == nullptr || info->si_code <= 0) ::raise(sig);
    }
    errno = saved_errno;
  }

  void install_handlers() {
    for (int sig : handled) {
      struct sigaction act {};
      act.sa_sigaction = &on_signal;
      act.sa_flags = SA_SIGINFO | SA_RESTART;
      sigemptyset(&act.sa_mask);  // no handled signal interrupts a dump of another
      for (int other : handled) sigaddset(&act.sa_mask, other);
      ::sigaction(sig, &act, &previous(sig));
    }
  }

  std::string dir_;
  std::atomic<int> rank_{-1};
  std::atomic<const char*> first_{nullptr};
  mutable std::atomic<unsigned long> next_temp_{0};
};

/// Marks `call` failed with `what` and dumps (a deadline, a lost peer, a mismatch: the moment a
/// record is wanted). Never throws: the caller is raising the error itself.
inline void record_failure(scoped_call& call, const std::string& what) noexcept {
  try {
    const char* why = recorder::intern(what);
    call.failed(why);
    dumper& d = dumper::global();
    d.note(why);
    d.dump_to_dir(why);
  } catch (...) {  // out of memory while recording: the error itself still reaches the caller
  }
}

/// Dumps the recorder now: to `file` if given, else to DTRAIN_FLIGHT_DIR's file for this process.
/// @returns the path written, or empty when there was none or it could not be written.
inline std::string dump(std::string_view reason = "asked by the program", const std::string& file = {}) {
  const char* why = recorder::intern(reason);
  dumper& d = dumper::global();
  if (!file.empty()) return d.dump_to(file.c_str(), why) ? file : std::string();
  return d.dump_to_dir(why) ? d.path() : std::string();
}

}  // namespace dtrain::flight
