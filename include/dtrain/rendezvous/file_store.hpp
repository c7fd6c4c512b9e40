#pragma once
/// @file
/// `file_store`: a store in a directory every rank can see (a shared file system, or /tmp for
/// the ranks of one machine). Values are files written whole and renamed into place; `add`
/// holds an flock on the key's lock file.

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

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
    return write_atomically(path_of(key), value, ec);
  }

  std::vector<std::byte> get(const std::string& key, deadline d, std::error_code& ec) noexcept {
    if (!detail::valid_store_call(key, 0, ec)) return {};
    auto path = path_of(key);
    auto pause = std::chrono::milliseconds(1);
    while (true) {
      std::ifstream in(path, std::ios::binary);
      if (in) {
        std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        ec.clear();
        std::vector<std::byte> v(raw.size());
        std::transform(raw.begin(), raw.end(), v.begin(), [](char c) { return static_cast<std::byte>(c); });
        return v;
      }
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
    auto lock_path = path_of(key + ".lock");
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
    {
      std::ifstream in(path_of(key));
      if (in) in >> value;
    }
    value += delta;
    std::string text = std::to_string(value);
    write_atomically(path_of(key), as_value(text), ec);
    ::flock(fd, LOCK_UN);
    ::close(fd);
    return ec ? 0 : value;
  }

 private:
  // Keys become file names: bytes other than [A-Za-z0-9._-] are escaped as %XX.
  std::filesystem::path path_of(const std::string& key) const {
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
    return dir_ / name;
  }

  static bool write_atomically(const std::filesystem::path& path, std::span<const std::byte> value,
                               std::error_code& ec) noexcept {
    thread_local std::mt19937_64 rng{std::random_device{}()};
    auto tmp = path;
    tmp += ".tmp" + std::to_string(rng());
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
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
