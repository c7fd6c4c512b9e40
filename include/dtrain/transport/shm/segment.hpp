#pragma once
// The operating-system pieces of the shared-memory transport: a POSIX shared-memory segment
// (created 0600 under a random name, unlinked as soon as every rank has mapped it), futex waits
// and wakes on a word in it, and a watch on a peer process that says when it has exited.

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>

#include "dtrain/core/error.hpp"
#include "dtrain/detail/message_parts.hpp"
#include "dtrain/transport/byte_operation.hpp"

namespace dtrain::detail::shm {

inline std::string os_error(const std::string& what) { return what + ": " + std::strerror(errno); }

/// A mapped POSIX shared-memory segment. The creator owns the name and unlinks it (at once when
/// asked, or when destroyed at the latest), so a job that fails while forming leaves nothing.
class segment {
 public:
  segment() = default;
  segment(segment&& o) noexcept { swap(o); }
  segment& operator=(segment o) noexcept {
    swap(o);
    return *this;
  }
  ~segment() {
    if (base_ != nullptr) ::munmap(base_, bytes_);
    unlink();
  }

  /// Creates a segment of `bytes` under a fresh name no other job can guess ("/dtrain-" and 128
  /// random bits), readable and writable by this user only. @throws dtrain::error
  static segment create(std::size_t bytes) {
    unsigned char random[16];
    if (::getrandom(random, sizeof random, 0) != static_cast<ssize_t>(sizeof random)) {
      throw error(errc::invalid_argument, os_error("dtrain: getrandom for a shared-memory name"));
    }
    static constexpr char digits[] = "0123456789abcdef";
    std::string name = "/dtrain-";
    for (unsigned char b : random) {
      name.push_back(digits[b >> 4]);
      name.push_back(digits[b & 15]);
    }
    const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) throw error(errc::invalid_argument, os_error("dtrain: cannot create shared memory " + name));
    segment s;
    s.name_ = name;
    s.owner_ = true;
    if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      const std::string why = os_error("dtrain: cannot size shared memory " + name + " to " + std::to_string(bytes) +
                                       " bytes (is /dev/shm large enough?)");
      ::close(fd);
      throw error(errc::invalid_argument, why);
    }
    s.map(fd, bytes);
    return s;
  }

  /// Maps the segment `owner` ("rank 3") created, which must be `bytes` long. @throws dtrain::error
  static segment open(const std::string& name, std::size_t bytes, const std::string& owner) {
    const int fd = ::shm_open(name.c_str(), O_RDWR, 0);
    if (fd < 0) {
      throw error(errc::invalid_argument, os_error("dtrain: cannot open " + owner + "'s shared memory " + name +
                                                   " (it runs on another host, or failed while the group formed)"));
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) != bytes) {
      ::close(fd);
      throw error(errc::protocol_error, "dtrain: shared memory " + name + " is " + std::to_string(st.st_size) +
                                            " bytes where " + std::to_string(bytes) + " were announced");
    }
    segment s;
    s.name_ = name;
    s.map(fd, bytes);
    return s;
  }

  /// Removes the name: mappings stay valid, nobody can open it any more.
  void unlink() noexcept {
    if (owner_ && !name_.empty()) ::shm_unlink(name_.c_str());
    owner_ = false;
  }

  std::byte* data() const noexcept { return base_; }
  std::size_t size() const noexcept { return bytes_; }
  const std::string& name() const noexcept { return name_; }

 private:
  void map(int fd, std::size_t bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const std::string why = p == MAP_FAILED ? os_error("dtrain: cannot map shared memory " + name_) : "";
    ::close(fd);
    if (p == MAP_FAILED) throw error(errc::invalid_argument, why);
    base_ = static_cast<std::byte*>(p);
    bytes_ = bytes;
  }
  void swap(segment& o) noexcept {
    std::swap(base_, o.base_);
    std::swap(bytes_, o.bytes_);
    std::swap(name_, o.name_);
    std::swap(owner_, o.owner_);
  }

  std::byte* base_ = nullptr;
  std::size_t bytes_ = 0;
  std::string name_;
  bool owner_ = false;
};

/// Sleeps while `*word` holds `seen`, for at most `timeout` (a futex shared between processes).
inline void futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t seen,
                       std::chrono::microseconds timeout) noexcept {
  const auto us = std::max<std::int64_t>(timeout.count(), 1);
  timespec ts{static_cast<time_t>(us / 1000000), static_cast<long>(us % 1000000) * 1000};
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

/// Wakes every thread, in any process, sleeping on `*word`.
inline void futex_wake(std::atomic<std::uint32_t>* word) noexcept {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

/// Copies the ranges `from` of process `pid`'s memory into `into` (which hold as many bytes) with
/// process_vm_readv: one copy, by the kernel. @returns 0, or the errno of the failed call.
inline int read_process(int pid, const receive_parts& into, const remote_ranges& from) noexcept {
  std::size_t li = 0, lo = 0;
  for (std::size_t ri = 0; ri < from.count; ++ri) {
    for (std::size_t ro = 0; ro < from.bytes[ri];) {
      while (li < into.count() && lo == into[li].size()) ++li, lo = 0;
      if (li == into.count()) return EFAULT;
      const std::size_t n = std::min<std::size_t>(into[li].size() - lo, from.bytes[ri] - ro);
      iovec local{into[li].data() + lo, n};
      iovec remote{reinterpret_cast<void*>(from.address[ri] + ro), n};
      const ssize_t got = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
      if (got <= 0) return got < 0 ? errno : EIO;
      lo += static_cast<std::size_t>(got);
      ro += static_cast<std::size_t>(got);
    }
  }
  return 0;
}

/// Whether this process may read process `pid`'s memory, tried on 8 bytes at `address` that must
/// hold `expect`; `why` says why not.
inline bool can_read_process(int pid, std::uint64_t address, std::uint64_t expect, std::string& why) noexcept {
  std::uint64_t got = 0;
  remote_ranges r;
  r.count = 1;
  r.address[0] = address;
  r.bytes[0] = sizeof got;
  const int err = read_process(pid, receive_parts(std::as_writable_bytes(std::span(&got, 1))), r);
  if (err != 0) {
    why = std::string("process_vm_readv: ") + std::strerror(err) +
          (err == EPERM ? " (ptrace is restricted: kernel.yama.ptrace_scope, or a container without CAP_SYS_PTRACE)"
                        : "");
    return false;
  }
  if (got != expect) why = "process_vm_readv read the wrong bytes (another process under that pid?)";
  return got == expect;
}

/// Says whether a process has exited: a pidfd that polls readable (Linux 5.3), else kill(pid, 0).
class process_watch {
 public:
  process_watch() = default;
  explicit process_watch(int pid) : pid_(pid), fd_(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0))) {}
  process_watch(process_watch&& o) noexcept : pid_(o.pid_), fd_(std::exchange(o.fd_, -1)) {}
  process_watch& operator=(process_watch&& o) noexcept {
    std::swap(pid_, o.pid_);
    std::swap(fd_, o.fd_);
    return *this;
  }
  ~process_watch() {
    if (fd_ >= 0) ::close(fd_);
  }

  bool exited() const noexcept {
    if (pid_ <= 0) return false;
    if (fd_ >= 0) {
      pollfd p{fd_, POLLIN, 0};
      return ::poll(&p, 1, 0) > 0;
    }
    return ::kill(pid_, 0) != 0 && errno == ESRCH;
  }
  int pid() const noexcept { return pid_; }

 private:
  int pid_ = 0;
  int fd_ = -1;
};

}  // namespace dtrain::detail::shm
