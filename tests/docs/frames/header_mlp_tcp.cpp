// Statements in a function given the reader's model and this rank's batches, over TCP (compiled
// only); the model, `my_model`, is examples/fashion_mnist's MLP.
// links: dtrain::asio Eigen3::Eigen
// needs: asio eigen
#include <vector>

#include <dtrain/dtrain.hpp>
#include <dtrain/transport/tcp.hpp>

#include "examples/fashion_mnist/mlp.hpp"

using my_model = fashion_mnist::mlp;

void doc_block(my_model& model, const std::vector<my_model::batch_type>& my_shard) {
// @block@
}
