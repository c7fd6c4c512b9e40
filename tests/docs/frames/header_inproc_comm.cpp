// Statements given a host communicator (in-process) and this rank's buffers: gradients, weights,
// its block of an uneven gather, integer values (compiled only; a block uses some of them).
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include <dtrain/collective/communicator.hpp>
#include <dtrain/collective/user_op.hpp>
#include <dtrain/transport/inproc.hpp>

#pragma GCC diagnostic ignored "-Wunused-parameter"
void doc_block(dtrain::communicator<dtrain::inproc_transport>& comm, std::vector<float>& grads,
               std::vector<float>& weights, const std::vector<float>& mine, std::vector<std::int64_t>& values) {
// @block@
}
