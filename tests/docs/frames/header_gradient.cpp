// Statements given a gradient buffer of n values (compiled only).
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <dtrain/compress/topk.hpp>

void doc_block(std::span<const float> grad, std::size_t n) {
// @block@
}
