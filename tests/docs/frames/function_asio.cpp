// Statements in a function that is given the reader's gradients, over TCP (compiled only).
// links: dtrain::asio
// needs: asio
#include <optional>
#include <span>
#include <vector>

#include <dtrain/collective/communicator.hpp>
#include <dtrain/topology/mesh.hpp>
#include <dtrain/transport/group.hpp>
#include <dtrain/transport/tcp.hpp>

#pragma GCC diagnostic ignored "-Wunused-variable"
void doc_block(std::vector<float>& grads) {
// @block@
}
