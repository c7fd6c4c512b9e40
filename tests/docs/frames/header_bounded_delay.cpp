// Statements given a parameter-server worker (`ps_worker`, under bounded delay), sorted unique
// keys, their weights, a step count and the gradients of step t (compiled only).
#include <cstdint>
#include <span>
#include <vector>

#include <dtrain/consistency/bounded_delay.hpp>
#include <dtrain/ps/worker.hpp>
#include <dtrain/transport/inproc.hpp>

using ps_worker = dtrain::ps::worker<dtrain::inproc_transport, dtrain::bounded_delay<2>>;

void doc_block(ps_worker& worker, std::span<const dtrain::ps::key_type> keys, std::span<float> weights,
               std::int64_t steps) {
  std::vector<float> g(keys.size());
  auto grads = [&](std::int64_t) { return std::span<const float>(g); };
// @block@
}
