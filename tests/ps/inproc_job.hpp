#pragma once
// Parameter-server jobs as threads of one process (the in-process transport), for the tests in
// server_worker.cpp and push_pull.cpp: short deadlines, a job of servers and workers, and the
// deterministic gradient their workers push.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../catch.hpp"
#include "dtrain/consistency/bounded_delay.hpp"
#include "dtrain/consistency/policies.hpp"
#include "dtrain/ps/server.hpp"
#include "dtrain/ps/worker.hpp"
#include "dtrain/transport/inproc.hpp"
#include "dtrain/updater/sgd.hpp"

namespace dtrain::ps_job {

using namespace dtrain::ps;
using namespace std::chrono_literals;

inline ps_options quick() {
  ps_options o;
  o.timeout = 20s;
  o.heartbeat_interval = 50ms;
  o.heartbeat_timeout = 5s;
  return o;
}

// Runs `servers` server threads and one thread per worker running `body(worker&)`.
template <class Consistency, class Body>
std::vector<server_stats> run_job(int servers, int workers, Body body, apply_mode mode = apply_mode::update,
                                  double lr = 0.1, ps_options o = quick(), key_type key_space = 1 << 20) {
  std::vector<server_stats> stats(static_cast<std::size_t>(servers));
  const roles r = roles::of(servers + workers, servers);
  run_inproc(servers + workers, [&](int rank, inproc_transport t) {
    if (r.is_server(rank)) {
      server<inproc_transport, Consistency, float, sgd<float>> s(std::move(t), r, Consistency{}, sgd<float>(lr), {}, o,
                                                                 mode);
      s.run();
      stats[static_cast<std::size_t>(rank)] = s.stats();
    } else {
      worker<inproc_transport, Consistency, float> w(std::move(t), r, range_sharding(servers, key_space), o);
      body(w);
      w.finish();
    }
  });
  return stats;
}

// A worker's gradient at clock c for key k from the weights it pulled: deterministic, different
// per worker, depending on the weights (so the order of updates matters).
inline float gradient(int worker, std::int64_t clock, key_type key, float w) {
  return 0.5f * w - 0.01f * static_cast<float>((key % 7) + 1) + 0.001f * static_cast<float>(worker + 1) *
                                                                    static_cast<float>(clock % 5);
}

// One clock of synchronous SGD on `keys`: pull, the gradient at what was pulled, push, clock.
template <class Worker>
void sync_step(Worker& w, std::span<const key_type> keys, std::vector<float>& weights, std::vector<float>& grads,
               std::int64_t c) {
  auto pulled = w.pull(keys, std::span(weights), 1);
  w.wait(pulled);
  for (std::size_t i = 0; i < keys.size(); ++i) grads[i] = gradient(w.id(), c, keys[i], weights[i]);
  auto pushed = w.push(keys, std::span<const float>(grads), 1);
  w.wait(pushed);
  auto clocked = w.clock();
  w.wait(clocked);
}

}  // namespace dtrain::ps_job
