#pragma once
// Files for the checkpoint tests: a directory of their own, and damage done to a file the way a
// bad disk or a torn copy would.

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <ios>
#include <string>

namespace dtrain::testing {

/// A fresh directory under the system's temporary one, removed with everything in it.
struct temp_dir {
  std::string path;
  temp_dir() {
    static std::atomic<int> count{0};
    path = (std::filesystem::temp_directory_path() /
            ("dtrain-test-" + std::to_string(::getpid()) + "-" + std::to_string(count++)))
               .string();
    std::filesystem::create_directories(path);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() { std::filesystem::remove_all(path); }
};

/// Flips one bit of the byte at `offset` of `path`, in place.
inline void flip_bit(const std::string& path, std::streamoff offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset);
  char c = 0;
  f.read(&c, 1);
  f.seekp(offset);
  c = static_cast<char>(c ^ 0x10);
  f.write(&c, 1);
}

}  // namespace dtrain::testing
