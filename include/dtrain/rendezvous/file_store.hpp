#pragma once
/// @file
/// `file_store`: a store in a directory every rank can see (a shared file system, or /tmp for
/// the ranks of one machine). Values are files written whole and renamed into place; `add`
/// holds an flock on the key's lock file. Values, locks and files being written have names of
/// their own ("v-", "l-", "t-"), so no key reads another's lock or a half-written value; a key
/// too long for a file name (past about 200 bytes escaped) is stored under its hash, with the
/// key at the file's start, compared on every read.

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/core/hash.hpp"
#include "dtrain/rendezvous/store.hpp"

namespace dtrain {

class file_store : public detail::store_throwing_forms<file_store> {
 public:
  using detail::store_throwing_forms<file_store>::set;
  using detail::store_throwing_forms<file_store>::get;
  using detail::store_throwing_forms<file_store>::add;

  /// Uses (and creates) directory `dir`. @throws dtrain::error if it cannot be created
  explicit file_store(std::filesystem::path dir) : dir_(std::move(dir)) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec || !std::filesystem::is_directory(dir_)) {
      throw error(errc::invalid_argument, "dtrain: file store directory " + dir_.string() +
                                              " cannot be created: " + ec.message());
    }
  }

  const std::filesystem::path& directory() const noexcept { return dir_; }

  bool set(const std::string& key, std::span<const std::byte> value, deadline, std::error_code& ec) noexcept {
    if (!detail::valid_store_call(key, value.size(), ec)) return false;
    return write_value(place_of(key), value, ec);
  }

  std::vector<std::byte> get(const std::string& key, deadline d, std::error_code& ec) noexcept {
    if (!detail::valid_store_call(key, 0, ec)) return {};
    const place where = place_of(key);
    auto pause = std::chrono::milliseconds(1);
    while (true) {
      if (auto v = read_value(where, ec)) return std::move(*v);
      if (ec) return {};
      if (d.expired()) {
        ec = make_error_code(errc::timeout);
        return {};
      }
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(pause, d.remaining()));
      pause = std::min(pause * 2, std::chrono::milliseconds(50));
    }
  }

  std::int64_t add(const std::string& key, std::int64_t delta, deadline d, std::error_code& ec) noexcept {
    if (!detail::valid_store_call(key, 0, ec)) return 0;
    const place where = place_of(key);
    const auto lock_path = dir_ / ("l-" + where.name);
    int fd = ::open(lock_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
      ec = std::error_code(errno, std::system_category());
      return 0;
    }
    while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      if (d.expired()) {
        ::close(fd);
        ec = make_error_code(errc::timeout);
        return 0;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::int64_t value = 0;
    if (auto v = read_value(where, ec)) {
      const std::string text(reinterpret_cast<const char*>(v->data()), v->size());
      value = std::strtoll(text.c_str(), nullptr, 10);
    }
    if (!ec) {
      value += delta;
      const std::string text = std::to_string(value);
      write_value(where, as_value(text), ec);
    }
    ::flock(fd, LOCK_UN);
    ::close(fd);
    return ec ? 0 : value;
  }

 private:
  // A value's file: "v-" and the key with bytes other than [A-Za-z0-9._-] escaped as %XX; or,
  // where that would pass a file name's 255 bytes, "h-" and the key's hash, the file holding the
  // escaped key and a newline before the value (`check`).
  struct place {
    std::string name;   // after the prefix; the lock's is "l-" and this
    std::string check;  // empty, or the escaped key a hashed file must start with
  };
  static place place_of(const std::string& key) {
    static constexpr char hex[] = "0123456789ABCDEF";
    std::string name;
    for (unsigned char c : key) {
      if (std::isalnum(c) || c == '.' || c == '_' || c == '-') {
        name.push_back(static_cast<char>(c));
      } else {
        name.push_back('%');
        name.push_back(hex[c >> 4]);
        name.push_back(hex[c & 15]);
      }
    }
    if (name.size() <= 200) return {name, ""};
    std::uint64_t h = fnv1a().text(key).value();
    std::string hashed(16, '0');
    for (int i = 15; i >= 0; --i, h >>= 4) hashed[static_cast<std::size_t>(i)] = hex[h & 15];
    return {"~" + hashed, std::move(name)};
  }

  std::filesystem::path value_path(const place& p) const { return dir_ / ((p.check.empty() ? "v-" : "h-") + p.name); }

  // The value, or nothing when it is not there yet; `ec` set when a hashed file holds another key.
  std::optional<std::vector<std::byte>> read_value(const place& p, std::error_code& ec) const {
    ec.clear();
    std::ifstream in(value_path(p), std::ios::binary);
    if (!in) return std::nullopt;
    std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::size_t from = 0;
    if (!p.check.empty()) {
      if (raw.compare(0, p.check.size(), p.check) != 0 || raw.size() <= p.check.size() ||
          raw[p.check.size()] != '\n') {
        ec = make_error_code(errc::invalid_argument);  // two keys of one hash: never taken for each other
        return std::nullopt;
      }
      from = p.check.size() + 1;
    }
    std::vector<std::byte> v(raw.size() - from);
    std::transform(raw.begin() + static_cast<std::ptrdiff_t>(from), raw.end(), v.begin(),
                   [](char c) { return static_cast<std::byte>(c); });
    return v;
  }

  bool write_value(const place& p, std::span<const std::byte> value, std::error_code& ec) const {
    std::string head = p.check.empty() ? std::string() : p.check + "\n";
    return write_atomically(value_path(p), dir_ / ("t-" + p.name), std::as_bytes(std::span(head)), value, ec);
  }

  // `head` then `value` into a file beside `path` (`staging` and a random number), renamed onto it.
  static bool write_atomically(const std::filesystem::path& path, std::filesystem::path staging,
                               std::span<const std::byte> head, std::span<const std::byte> value,
                               std::error_code& ec) noexcept {
    thread_local std::mt19937_64 rng{std::random_device{}()};
    auto tmp = std::move(staging);
    tmp += "." + std::to_string(rng());
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(head.data()), static_cast<std::streamsize>(head.size()));
      out.write(reinterpret_cast<const char*>(value.data()), static_cast<std::streamsize>(value.size()));
      if (!out) {
        ec = std::make_error_code(std::errc::io_error);
        return false;
      }
    }
    std::filesystem::rename(tmp, path, ec);
    return !ec;
  }

  std::filesystem::path dir_;
};

}  // namespace dtrain
