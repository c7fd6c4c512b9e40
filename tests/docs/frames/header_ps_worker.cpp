// Statements on a worker rank given its TCP transport, the job's roles, sorted unique keys and
// the buffers of their weights and gradients (compiled only).
// links: dtrain::asio
// needs: asio
#include <span>
#include <utility>
#include <vector>

#include <dtrain/consistency/policies.hpp>
#include <dtrain/ps/worker.hpp>
#include <dtrain/transport/tcp.hpp>

using namespace dtrain;

void doc_block(tcp_transport t, const ps::roles& roles, const std::vector<ps::key_type>& keys,
               std::vector<float>& weights, const std::vector<float>& grads) {
// @block@
}
