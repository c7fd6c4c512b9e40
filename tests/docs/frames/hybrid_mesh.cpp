// The hybrid set-up in examples/fashion_mnist_parallel/main.cpp's terms: its stage over the tp
// group's communicator, the world as a process group over TCP, its settings, a schedule and the
// trainer's options (compiled only; the example runs it: fashion_mnist_parallel_* tests).
// links: dtrain::asio Eigen3::Eigen
// needs: asio eigen
#include <cstdint>
#include <utility>
#include <vector>

#include <dtrain/collective/communicator.hpp>
#include <dtrain/pipeline/partition.hpp>
#include <dtrain/pipeline/schedule.hpp>
#include <dtrain/pipeline/trainer.hpp>
#include <dtrain/topology/mesh.hpp>
#include <dtrain/transport/group.hpp>
#include <dtrain/transport/tcp.hpp>
#include <dtrain/updater/momentum.hpp>

#include "examples/fashion_mnist_parallel/stage.hpp"

#pragma GCC diagnostic ignored "-Wunused-variable"

using group = dtrain::process_group<dtrain::tcp_transport>;
using comm = dtrain::communicator<group>;
using stage = fashion_mnist::parallel_stage<comm>;
struct settings {
  int pp = 2, tp = 2;
  std::uint64_t seed = 1;
  double lr = 0.05, momentum = 0.9;
};

template <class Schedule>
void doc_block(group& world, const settings& s, Schedule schedule, int dp, const std::vector<int>& widths,
               const dtrain::pipeline::partition& bounds, const fashion_mnist::sample_source& source,
               const dtrain::pipeline::trainer_options& options) {
  const int v = schedule.chunks();
// @block@
}

template void doc_block(group&, const settings&, dtrain::pipeline::interleaved_one_f_one_b, int,
                        const std::vector<int>&, const dtrain::pipeline::partition&,
                        const fashion_mnist::sample_source&, const dtrain::pipeline::trainer_options&);
