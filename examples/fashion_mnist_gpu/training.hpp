#pragma once
// The interface between the example's host side (command line, data files, TCP: main.cpp,
// built by the C++ compiler) and its device side (the MLP on the GPU and the trainer:
// training.cu, built by nvcc). Only host types cross it.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include <dtrain/collective/nccl.hpp>
#include <dtrain/transport/any.hpp>

namespace fashion_mnist_gpu {

struct settings {
  int epochs = 10;
  std::size_t global_batch = 128;
  double lr = 0.05, momentum = 0.9;
  std::vector<int> widths{784, 256, 128, 10};
  std::uint64_t seed = 1;
  std::size_t log_every = 100;
  std::size_t first_bucket_bytes = std::size_t{1} << 20, bucket_bytes = std::size_t{25} << 20;
  bool overlap = true;
};

/// A split of the data set in host memory: pixels in [0, 1], row-major, 784 per image.
struct images {
  std::span<const float> pixels;
  std::span<const std::uint8_t> labels;
  std::size_t size() const { return labels.size(); }
};

struct progress_line {
  int epoch = 0;
  std::size_t step = 0, steps = 0;
  double loss = 0;  ///< this rank's batch loss
};

struct epoch_report {
  int epoch = 0;
  double train_loss = 0;      ///< mean batch loss on this rank's shard
  double test_accuracy = 0;   ///< on the whole test split
  double seconds = 0;
  double samples_per_second = 0;  ///< all ranks together
  double comm_share = 0;      ///< the share of step time spent waiting for communication
};

struct callbacks {
  std::function<void(const progress_line&)> progress;
  std::function<void(const epoch_report&)> epoch;
};

/// Trains with the allreduce trainer over NCCL (one rank per GPU).
std::vector<epoch_report> train_over_nccl(dtrain::nccl_communicator comm, const settings& s, const images& train,
                                          const images& test, const callbacks& report);

/// Trains with the allreduce trainer over `transport` (TCP), device buffers staged through pinned
/// memory and reduced by Thrust on the GPU: any number of ranks may share one GPU.
std::vector<epoch_report> train_over_staged(dtrain::any_transport transport, const settings& s, const images& train,
                                            const images& test, const callbacks& report);

}  // namespace fashion_mnist_gpu
