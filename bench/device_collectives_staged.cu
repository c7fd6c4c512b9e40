// bench_device_collectives' staged path: device buffers over TCP (any_transport, built by the
// host side), staged through pinned memory and reduced by Thrust on the GPU.

#include <utility>
#include <vector>

#include "device_collectives.hpp"
#include "dtrain/collective/staged.hpp"

namespace dtrain::bench {

std::vector<device_point> run_staged(any_transport t, const device_plan& plan) {
  staged_communicator<any_transport> c(std::move(t));
  std::vector<device_point> points;
  for (coll_op op : plan.ops) {
    for (std::size_t bytes : plan.sizes) {
      if (op == coll_op::message) {
        for (auto& p : measure_p2p(c, "staged", bytes, plan.warmup, plan.iterations)) points.push_back(p);
      } else {
        points.push_back(measure_device(c, op, bytes, plan.warmup, plan.iterations));
      }
    }
  }
  return points;
}

}  // namespace dtrain::bench
