// Statements on one rank's thread of an in-process group, given its rank and its gradients
// (compiled only).
#include <span>
#include <vector>

#include <dtrain/collective/communicator.hpp>
#include <dtrain/transport/inproc.hpp>

void doc_block(int r, std::vector<float>& grads) {
// @block@
}
