// Statements in a model's forward pass, given the allreduce trainer that trains it over TCP, this
// rank's activations ([samples][channels]) and the channel count (compiled only).
// links: dtrain::asio Eigen3::Eigen
// needs: asio eigen
#include <cstddef>
#include <span>

#include <dtrain/dtrain.hpp>
#include <dtrain/transport/tcp.hpp>

#include "examples/fashion_mnist/mlp.hpp"

#pragma GCC diagnostic ignored "-Wunused-variable"
void doc_block(dtrain::allreduce::trainer<dtrain::ring<dtrain::tcp_transport>, dtrain::momentum<float>,
                                          fashion_mnist::mlp>& trainer,
               std::span<const float> activations, std::size_t channels) {
// @block@
}
