#pragma once
// What the NCCL tests share (nccl.cpp, nccl_p2p.cpp): a fresh rendezvous directory per case, plain
// copies between host vectors and device spans, and ranks as threads with a GPU each.

#include <unistd.h>

#include <exception>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/collective/nccl.hpp"
#include "dtrain/core/memory_space.hpp"
#include "dtrain/cuda/runtime.hpp"
#include "dtrain/rendezvous/file_store.hpp"

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

/// Runs `body(comm, failures)` on `p` ranks, one thread and GPU each (rank r on device r), each
/// joining through a fresh directory with options `o`. @returns what went wrong, a line each: the
/// lines `body` added, and the exceptions that left it, naming the rank.
template <class Body>
std::vector<std::string> on_gpu_ranks(int p, const std::string& name, nccl_options o, Body body) {
  const std::string dir = fresh_dir(name);
  std::vector<std::vector<std::string>> failures(static_cast<std::size_t>(p));
  std::vector<std::thread> ranks;
  for (int r = 0; r < p; ++r) {
    ranks.emplace_back([&, r, o]() mutable {
      auto& mine = failures[static_cast<std::size_t>(r)];
      try {
        file_store store(dir);
        o.device = r;
        auto comm = nccl_communicator::connect(store, r, p, o);
        body(comm, mine);
      } catch (const std::exception& e) {
        mine.push_back("rank " + std::to_string(r) + ": " + e.what());
      }
    });
  }
  for (auto& t : ranks) t.join();
  std::vector<std::string> all;
  for (auto& f : failures) all.insert(all.end(), f.begin(), f.end());
  return all;
}

}  // namespace dtrain::testing
