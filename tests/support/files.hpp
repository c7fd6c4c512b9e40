#pragma once
// File surgery for the checkpoint tests: damage a file the way a bad disk or a torn copy would.

#include <fstream>
#include <ios>
#include <string>

namespace dtrain::testing {

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
