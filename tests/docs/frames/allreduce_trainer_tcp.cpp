// Statements in a function given a model, trainer options and this rank's batches (compiled only);
// the model is examples/fashion_mnist's MLP.
// links: dtrain::asio Eigen3::Eigen
// needs: asio eigen
#include <vector>

#include <dtrain/dtrain.hpp>
#include <dtrain/transport/tcp.hpp>

#include "examples/fashion_mnist/mlp.hpp"

void doc_block(fashion_mnist::mlp& model, dtrain::allreduce::trainer_options options,
               const std::vector<fashion_mnist::mlp::batch_type>& my_shard) {
// @block@
}
