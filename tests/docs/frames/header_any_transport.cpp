// Statements in a host translation unit that hands a transport to a function defined in a .cu
// file, declared here (compiled only).
// links: dtrain::asio
// needs: asio
#include <utility>

#include <dtrain/transport/any.hpp>
#include <dtrain/transport/tcp.hpp>

void run_on_gpu(dtrain::any_transport t);  // a .cu file's: staged_communicator<any_transport>

void doc_block() {
// @block@
}
