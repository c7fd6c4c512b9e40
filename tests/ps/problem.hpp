#pragma once
// The dense model the parameter-server algorithm tests train: least squares on each worker's
// own data, batches chosen by iteration. Shared by the in-process tests and the TCP worker.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace dtrain::testing {

inline constexpr std::size_t dim = 12, samples = 64, batch = 8;

// Worker w's least-squares data: y = a . truth + noise.
struct problem {
  std::vector<float> a, y;
  explicit problem(int w) : a(samples * dim), y(samples) {
    std::mt19937 gen(static_cast<unsigned>(100 + w));
    std::normal_distribution<float> n01;
    std::vector<float> truth(dim);
    for (std::size_t j = 0; j < dim; ++j) truth[j] = 0.1f * static_cast<float>(j) - 0.5f;
    for (std::size_t s = 0; s < samples; ++s) {
      float dot = 0;
      for (std::size_t j = 0; j < dim; ++j) dot += (a[s * dim + j] = n01(gen)) * truth[j];
      y[s] = dot + 0.05f * n01(gen);
    }
  }
  // Mean gradient over the batch of iteration t.
  void grad(std::span<const float> x, std::span<float> g, std::int64_t t) const {
    std::fill(g.begin(), g.end(), 0.0f);
    const std::size_t first = (static_cast<std::size_t>(t) * batch) % samples;
    for (std::size_t s = first; s < first + batch; ++s) {
      float err = -y[s];
      for (std::size_t j = 0; j < dim; ++j) err += a[s * dim + j] * x[j];
      for (std::size_t j = 0; j < dim; ++j) g[j] += err * a[s * dim + j] / static_cast<float>(batch);
    }
  }
  float loss(std::span<const float> x) const {
    float l = 0;
    for (std::size_t s = 0; s < samples; ++s) {
      float err = -y[s];
      for (std::size_t j = 0; j < dim; ++j) err += a[s * dim + j] * x[j];
      l += 0.5f * err * err / samples;
    }
    return l;
  }
};

}  // namespace dtrain::testing
