// Statements in a function given a TCP world, the example's training split, widths and seed
// (compiled only), with examples/sharded_mlp's unit model.
// links: dtrain::asio Eigen3::Eigen
// needs: asio eigen
#include <cstdint>
#include <vector>

#include <dtrain/allreduce/trainer.hpp>
#include <dtrain/sharded/whole_model.hpp>
#include <dtrain/transport/group.hpp>
#include <dtrain/dtrain.hpp>
#include <dtrain/transport/tcp.hpp>

#include "examples/sharded_mlp/unit_mlp.hpp"

using comm_t = dtrain::communicator<dtrain::process_group<dtrain::tcp_transport>>;

#pragma GCC diagnostic ignored "-Wunused-variable"
void doc_block(dtrain::process_group<dtrain::tcp_transport>& world, const fashion_mnist::split& train,
               std::vector<int> widths, std::uint64_t seed) {
// @block@
}
