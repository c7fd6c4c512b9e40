// Statements in a function given the world's TCP transport (compiled only).
// links: dtrain::asio
// needs: asio
#include <utility>

#include <dtrain/topology/mesh.hpp>
#include <dtrain/transport/group.hpp>
#include <dtrain/transport/tcp.hpp>

#pragma GCC diagnostic ignored "-Wunused-variable"
void doc_block(dtrain::tcp_transport world) {
// @block@
}
