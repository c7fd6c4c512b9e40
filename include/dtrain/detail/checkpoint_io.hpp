#pragma once
/// @file
/// What every checkpoint format of dtrain writes and reads with (the parameter server's shards,
/// the pipeline trainer's stages): little-endian fields, and files replaced atomically and
/// durably (a temporary file, fsync, rename, fsync of the directory), so a crash leaves either
/// the old file or the new one, never a torn one.

#include <bit>
#include <cerrno>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <unistd.h>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/frame.hpp"
#include "dtrain/core/hash.hpp"

namespace dtrain::detail {

class byte_writer {
 public:
  template <std::integral U>
  void put(U v) {
    const std::size_t at = bytes.size();
    bytes.resize(at + sizeof(U));
    wire::put(bytes.data() + at, v);
  }
  template <std::floating_point F>
  void put(F v) {
    if constexpr (sizeof(F) == 4) put(std::bit_cast<std::uint32_t>(v));
    else put(std::bit_cast<std::uint64_t>(v));
  }
  void put(std::string_view s) {
    put(static_cast<std::uint32_t>(s.size()));
    for (char c : s) bytes.push_back(static_cast<std::byte>(c));
  }
  std::vector<std::byte> bytes;
};

class byte_reader {
 public:
  /// @param what what the bytes are, for errors ("checkpoint /path/to/file")
  byte_reader(std::span<const std::byte> b, std::string what) : bytes_(b), what_(std::move(what)) {}

  template <std::integral U>
  U get() {
    need(sizeof(U));
    const U v = wire::get<U>(bytes_.data() + at_);
    at_ += sizeof(U);
    return v;
  }
  template <std::floating_point F>
  F get() {
    if constexpr (sizeof(F) == 4) return std::bit_cast<F>(get<std::uint32_t>());
    else return std::bit_cast<F>(get<std::uint64_t>());
  }
  std::string get_string() {
    const auto n = get<std::uint32_t>();
    need(n);
    std::string s(reinterpret_cast<const char*>(bytes_.data() + at_), n);
    at_ += n;
    return s;
  }
  std::size_t remaining() const noexcept { return bytes_.size() - at_; }
  void need(std::size_t n) const {
    if (remaining() < n) throw error(errc::bad_data, what_ + " is truncated");
  }

 private:
  std::span<const std::byte> bytes_;
  std::size_t at_ = 0;
  std::string what_;
};

[[noreturn]] inline void io_failure(const std::string& what, const std::string& path) {
  throw error(std::error_code(errno, std::generic_category()), "checkpoint: cannot " + what + " " + path);
}

/// Writes `bytes` to `path` atomically and durably.
inline void write_atomically(const std::string& path, std::span<const std::byte> bytes) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) io_failure("create", tmp);
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      errno = e;
      io_failure("write", tmp);
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    errno = e;
    io_failure("fsync", tmp);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    errno = e;
    io_failure("rename into place", path);
  }
  // The rename is durable once the directory is synced.
  const auto slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  if (const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

inline std::vector<std::byte> read_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) io_failure("open", path);
  std::vector<std::byte> out;
  std::byte chunk[1 << 16];
  for (std::size_t n; (n = std::fread(chunk, 1, sizeof chunk, f)) > 0;) out.insert(out.end(), chunk, chunk + n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) io_failure("read", path);
  return out;
}

/// "[1,2,3]": a list of numbers for the messages that say how a checkpoint differs. Appends
/// rather than operator+ chains: GCC 12 at -O3 warns falsely (-Wrestrict) on those.
template <class T>
std::string list_text(const std::vector<T>& v) {
  std::string s("[");
  for (std::size_t i = 0; i < v.size(); ++i) s.append(i == 0 ? "" : ",").append(std::to_string(v[i]));
  return s.append("]");
}

/// Starts a checkpoint with its 8-byte `magic`.
inline byte_writer checkpoint_writer(const char (&magic)[8]) {
  byte_writer w;
  for (char c : magic) w.bytes.push_back(static_cast<std::byte>(c));
  return w;
}

/// Seals `w` with an FNV-1a-64 checksum of everything in it and writes it to `path` atomically.
inline void write_checkpoint(const std::string& path, byte_writer& w) {
  w.put(fnv1a().bytes(w.bytes).value());
  write_atomically(path, w.bytes);
}

/// Reads a file `write_checkpoint` wrote and returns its contents between the magic and the
/// checksum. @throws dtrain::error `bad_data` naming the file when it does not start with `magic`
/// ("not a dtrain <kind>") or its checksum does not match (corrupt); the system error when it
/// cannot be read.
inline std::vector<std::byte> read_checkpoint(const std::string& path, const char (&magic)[8],
                                              const std::string& kind) {
  std::vector<std::byte> bytes = read_file(path);
  auto bad = [&](const std::string& what) { return error(errc::bad_data, "checkpoint " + path + " " + what); };
  if (bytes.size() < 16 || std::memcmp(bytes.data(), magic, 8) != 0) throw bad("is not a dtrain " + kind);
  const std::size_t body = bytes.size() - 8;
  if (fnv1a().bytes(std::span(bytes).first(body)).value() != wire::get<std::uint64_t>(bytes.data() + body)) {
    throw bad("is corrupt: its checksum does not match its contents");
  }
  return {bytes.begin() + 8, bytes.begin() + static_cast<std::ptrdiff_t>(body)};
}

}  // namespace dtrain::detail
