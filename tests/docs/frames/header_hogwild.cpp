// Statements given the reader's weights, learning rate, samples per thread and sparse gradient
// (declared, not defined: compiled only).
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include <dtrain/ps/hogwild.hpp>

struct my_sample {
  std::vector<std::size_t> features;
};
std::vector<my_sample> my_part(int thread);  // this thread's samples
// (coordinate, gradient) pairs of the loss at `s`, reading the shared weights
std::vector<std::pair<std::size_t, float>> sparse_gradient(const my_sample& s, dtrain::ps::hogwild_params<float> w);

void doc_block(std::vector<float>& weights, float lr) {
// @block@
}
