#pragma once
// What the NCCL tests share (nccl.cpp, nccl_p2p.cpp): a fresh rendezvous directory per case, and
// plain copies between host vectors and device spans.

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "dtrain/core/memory_space.hpp"
#include "dtrain/cuda/runtime.hpp"

namespace dtrain::testing {

/// An empty directory under the temporary one, named for the test and this process.
inline std::string fresh_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("dtrain_nccl_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

template <class T>
std::vector<T> to_host(device_span<const T> d) {
  std::vector<T> h(d.size());
  cuda::check(cudaMemcpy(h.data(), d.data(), d.size_bytes(), cudaMemcpyDeviceToHost), "D2H");
  return h;
}

template <class T>
void to_device(device_span<T> d, const std::vector<T>& h) {
  cuda::check(cudaMemcpy(d.data(), h.data(), d.size_bytes(), cudaMemcpyHostToDevice), "H2D");
}

}  // namespace dtrain::testing
