// Fashion-MNIST with model parallelism on device memory: fashion_mnist_parallel's MLP, mesh and
// schedules (--pp, --tp, the rest data parallel), with every stage's weights, gradients and
// activations in Thrust's device memory: the GPU's in a CUDA build (--kernels cublas or thrust),
// the CPU's under Thrust's CPP system, where the same code runs (and CI trains it).
//
//   dtrain-run -n 4 ./fashion_mnist_parallel_device --pp 2 --tp 2   # a pipeline of tensor-parallel stages
//   dtrain-run -n 2 ./fashion_mnist_parallel_device --pp 2 --kernels cublas --micro-batches 8
//   dtrain-run -n 2 ./fashion_mnist_parallel_device --pp 2 --kernels cublas --comm nccl   # a GPU per rank
//   ./fashion_mnist_parallel_device                                  # the one-process reference
//
// Ranks sharing a GPU talk through pinned host memory (the staged communicator, the default); with
// a GPU each, --comm nccl carries the pipeline's messages and the tp and dp collectives over NCCL.
// The rank holding the last stage of replica 0 prints progress, samples/s, test accuracy and the
// measured bubble.

#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include <dtrain/transport/any.hpp>
#include <dtrain/transport/tcp.hpp>

#include "cli.hpp"
#include "device_training.hpp"
#include "settings.hpp"

int main(int argc, char** argv) {
  fashion_mnist::settings s;
  CLI::App app{"Fashion-MNIST MLP, pipeline and tensor parallel, on device memory (launch with dtrain-run)"};
  fashion_mnist::add_options(app, s);
  app.add_option("--kernels", s.kernels, "the layers' products: thrust, or cublas (a CUDA build)")
      ->check(CLI::IsMember({"thrust", "cublas"}))
      ->capture_default_str();
  app.add_option("--comm", s.comm,
                 "the collectives between ranks: staged (TCP through pinned host memory, ranks may share a GPU), "
                 "or nccl (one GPU per rank; a CUDA build with NCCL)")
      ->check(CLI::IsMember({"staged", "nccl"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    const auto train = fashion_mnist::load(s.data, "train");
    const auto test = fashion_mnist::load(s.data, "t10k");
    return fashion_mnist::train_on_device(s, dtrain::any_transport(dtrain::tcp_transport::from_environment()), train,
                                          test);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fashion_mnist_parallel_device: %s\n", e.what());
    return 1;
  }
}
