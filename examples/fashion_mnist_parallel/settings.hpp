#pragma once
// What a run of the model-parallel Fashion-MNIST examples is asked to do (fashion_mnist_parallel
// on host memory, fashion_mnist_parallel_device on a GPU's), and the cut of the MLP into stages
// both use. No CLI here: nvcc compiles this too (cli.hpp reads it from the command line).

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <dtrain/pipeline/partition.hpp>

#include "../fashion_mnist/dataset.hpp"

namespace fashion_mnist {

struct settings {
  std::string data = fashion_mnist::default_directory;
  int epochs = 5, pp = 1, tp = 1, micro_batches = 4;
  std::string schedule = "1f1b";
  std::size_t global_batch = 128;
  double lr = 0.05, momentum = 0.9;
  std::vector<int> hidden{1024, 1024, 1024};
  std::size_t log_every = 100, limit_train = 0;
  std::uint64_t seed = 1;
  std::string json;
  double min_accuracy = 0;
  std::string kernels = "thrust";  // the device example's products: thrust, or cublas (a CUDA build)
  std::string comm = "staged";     // the device example's collectives: staged, or nccl (a CUDA build with NCCL)
};

// The layers' boundaries between stages: by parameter count, and with tensor parallelism only
// after a row-parallel layer (an even index), where every rank holds the whole activation.
inline dtrain::pipeline::partition cut(const std::vector<int>& widths, int stages, bool blocks) {
  std::vector<double> params;
  for (std::size_t l = 0; l + 1 < widths.size(); ++l) {
    const double n = double(widths[l]) * widths[l + 1] + widths[l + 1];
    if (blocks && l % 2 == 1) params.back() += n;
    else params.push_back(n);
  }
  auto bounds = dtrain::pipeline::balanced_partition(params, stages);
  if (blocks) {
    for (int& b : bounds) b *= 2;
  }
  return bounds;
}

/// Which samples the micro-batches of the current step (or evaluation pass) are: micro-batch i
/// is `indices[i * size, (i + 1) * size)` of `data`. The training loop points it at each batch.
struct sample_source {
  const split* data = nullptr;
  std::span<const std::size_t> indices;
  std::size_t micro_batch_size = 0;
};

/// Layer l's whole starting weights (out x in) and bias, drawn from (seed, l) alone, like
/// PyTorch's Linear (uniform in +-1/sqrt(fan_in)): every split of the model, on either memory,
/// starts from the same network.
inline std::pair<std::vector<float>, std::vector<float>> layer_start(std::uint64_t seed, int l, std::size_t in,
                                                                     std::size_t out) {
  std::mt19937_64 gen(seed * 1000003 + static_cast<std::uint64_t>(l));
  std::uniform_real_distribution<float> u(-1.0f / std::sqrt(float(in)), 1.0f / std::sqrt(float(in)));
  std::vector<float> w(in * out), b(out);
  for (float& v : w) v = u(gen);
  for (float& v : b) v = u(gen);
  return {std::move(w), std::move(b)};
}

/// Micro-batch `index`'s samples (indices into `source.data`).
inline std::span<const std::size_t> samples_of(const sample_source& source, int index) {
  return source.indices.subspan(static_cast<std::size_t>(index) * source.micro_batch_size, source.micro_batch_size);
}

/// Micro-batch `index`'s images, one row of pixels per sample (host memory).
inline std::vector<float> images_of(const sample_source& source, int index) {
  std::vector<float> x;
  x.reserve(source.micro_batch_size * pixels_per_image);
  for (std::size_t s : samples_of(source, index)) {
    const float* p = &source.data->pixels[s * pixels_per_image];
    x.insert(x.end(), p, p + pixels_per_image);
  }
  return x;
}

using clock_type = std::chrono::steady_clock;
inline double since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

}  // namespace fashion_mnist
