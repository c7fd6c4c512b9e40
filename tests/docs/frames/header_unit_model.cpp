// Statements given a transport (a process group over TCP), the collective type `comm_t` over it,
// and a unit model type, `my_unit_model`, with its constructor's arguments (compiled only); the
// unit model is examples/sharded_mlp's.
// links: dtrain::asio Eigen3::Eigen
// needs: asio eigen
#include <cstdint>
#include <vector>

#include <dtrain/allreduce/trainer.hpp>
#include <dtrain/collective/communicator.hpp>
#include <dtrain/sharded/whole_model.hpp>
#include <dtrain/transport/group.hpp>
#include <dtrain/transport/tcp.hpp>
#include <dtrain/updater/adam.hpp>

#include "examples/sharded_mlp/unit_mlp.hpp"

using my_unit_model = sharded_mlp::unit_mlp<float>;
using comm_t = dtrain::ring<dtrain::process_group<dtrain::tcp_transport>>;

void doc_block(dtrain::process_group<dtrain::tcp_transport>& transport, std::vector<int> widths,
               const fashion_mnist::split& train, std::uint64_t seed) {
// @block@
}
