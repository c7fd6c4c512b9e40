// Fashion-MNIST with model parallelism: an MLP of 1024-wide layers split into pipeline stages
// (--pp) and tensor-parallel slices (--tp), replicated data-parallel over the remaining ranks,
// on a device mesh {dp, pp, tp} of TCP processes.
//
//   dtrain-run -n 4 ./fashion_mnist_parallel --pp 2              # 2 stages x 2 replicas
//   dtrain-run -n 4 ./fashion_mnist_parallel --tp 2              # 2-way tensor parallel x 2 replicas
//   dtrain-run -n 2 ./fashion_mnist_parallel --pp 2 --schedule gpipe --micro-batches 8
//   ./fashion_mnist_parallel                                     # the one-process reference
//
// Each replica trains on its shard of every epoch (global batch split evenly, then into
// micro-batches); the stages are cut by parameter count (with --tp, between MLP blocks). The
// rank holding the last stage of replica 0 prints progress; at the end every rank prints its
// share of the step spent computing, and the measured bubble.

#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <dtrain/collective/communicator.hpp>
#include <dtrain/transport/group.hpp>
#include <dtrain/transport/tcp.hpp>
#include <dtrain/updater/momentum.hpp>

#include "cli.hpp"
#include "settings.hpp"
#include "stage.hpp"
#include "training.hpp"

namespace {

// Host memory: the stages' layers on Eigen, the pipeline's activations in TCP messages.
struct host_layout {
  using transport = dtrain::tcp_transport;
  using group = dtrain::process_group<transport>;
  using pp_collective = group;
  using tp_collective = dtrain::communicator<group>;
  using dp_collective = dtrain::communicator<group>;
  using stage = fashion_mnist::parallel_stage<tp_collective>;
  using updater = dtrain::momentum<float>;
  static constexpr const char* memory = "host memory";
};

}  // namespace

int main(int argc, char** argv) {
  fashion_mnist::settings s;
  CLI::App app{"Fashion-MNIST MLP trained with pipeline and tensor parallelism over TCP (launch with dtrain-run)"};
  fashion_mnist::add_options(app, s);
  CLI11_PARSE(app, argc, argv);
  try {
    const auto train = fashion_mnist::load(s.data, "train");
    const auto test = fashion_mnist::load(s.data, "t10k");
    return fashion_mnist::with_schedule(s, [&](auto schedule) {
      return fashion_mnist::train<host_layout>(s, schedule, dtrain::tcp_transport::from_environment(), train, test,
                                               "fashion_mnist_parallel");
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fashion_mnist_parallel: %s\n", e.what());
    return 1;
  }
}
