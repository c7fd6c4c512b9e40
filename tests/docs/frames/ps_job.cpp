// Statements in a function that returns the process's exit status, given the reader's weights,
// step count and gradient function (compiled only).
// links: dtrain::asio
// needs: asio
#include <cstdint>
#include <span>
#include <vector>

#include <dtrain/ps/trainer.hpp>
#include <dtrain/dtrain.hpp>
#include <dtrain/transport/tcp.hpp>

int doc_block(std::vector<float>& weights, std::int64_t steps) {
  auto gradient_of_batch = [](std::span<const float> x, std::span<float> g, std::int64_t) {
    for (std::size_t i = 0; i < x.size(); ++i) g[i] = x[i];
  };
// @block@
  return 0;
}
