// Fashion-MNIST on the GPU with dtrain's allreduce trainer: the MLP of examples/fashion_mnist
// (784-256-128-10), its matrix products in cuBLAS, its gradients averaged on the device.
//
//   dtrain-run -n 1 ./fashion_mnist_gpu                         # NCCL, one GPU
//   dtrain-run -n 4 ./fashion_mnist_gpu                         # NCCL, one rank per GPU
//   dtrain-run -n 2 ./fashion_mnist_gpu --collective staged     # TCP, 2 ranks sharing one GPU
//
// This file is the host side (command line, data files, TCP); training.cu is the device side.

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <dtrain/collective/communicator.hpp>
#include <dtrain/collective/nccl.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/cuda/runtime.hpp>
#include <dtrain/transport/any.hpp>
#include <dtrain/transport/tcp.hpp>

#include "../fashion_mnist/dataset.hpp"
#include "training.hpp"

namespace {

struct options {
  std::string data = fashion_mnist::default_directory;
  std::string collective = "nccl";
  std::vector<int> hidden{256, 128};
  std::size_t limit_train = 0;
  double first_bucket_kib = 1024, bucket_mib = 25;
  bool no_overlap = false;
  double min_accuracy = 0;
};

// The exit status with no GPU: the convention for "skipped" that ctest's SKIP_RETURN_CODE reads.
constexpr int exit_no_device = 77;

int run(const options& o, fashion_mnist_gpu::settings s) {
  if (dtrain::cuda::device_count() == 0) {
    std::fprintf(stderr, "fashion_mnist_gpu: no CUDA device is visible: this example needs a GPU "
                         "(examples/fashion_mnist trains the same model on the CPU)\n");
    return exit_no_device;
  }
  s.widths = {static_cast<int>(fashion_mnist::pixels_per_image)};
  s.widths.insert(s.widths.end(), o.hidden.begin(), o.hidden.end());
  s.widths.push_back(fashion_mnist::classes);
  s.first_bucket_bytes = static_cast<std::size_t>(o.first_bucket_kib * 1024);
  s.bucket_bytes = static_cast<std::size_t>(o.bucket_mib * 1024 * 1024);
  s.overlap = !o.no_overlap;

  fashion_mnist::split train = fashion_mnist::load(o.data, "train");
  const fashion_mnist::split test = fashion_mnist::load(o.data, "t10k");
  if (o.limit_train > 0 && o.limit_train < train.size()) {
    train.labels.resize(o.limit_train);
    train.pixels.resize(o.limit_train * fashion_mnist::pixels_per_image);
  }
  const fashion_mnist_gpu::images train_view{train.pixels, train.labels}, test_view{test.pixels, test.labels};

  auto tcp = dtrain::tcp_transport::from_environment();
  const int rank = tcp.rank(), size = tcp.size();
  fashion_mnist_gpu::callbacks report;
  if (rank == 0) {
    fmt::print("fashion_mnist_gpu: {} ranks, {}, global batch {}, lr {}, momentum {}\n", size,
               o.collective == "nccl" ? "NCCL" : "device buffers staged over TCP", s.global_batch, s.lr, s.momentum);
    report.progress = [](const fashion_mnist_gpu::progress_line& p) {
      fmt::print("epoch {} step {}/{}  loss {:.4f}\n", p.epoch, p.step, p.steps, p.loss);
    };
    report.epoch = [&](const fashion_mnist_gpu::epoch_report& e) {
      fmt::print("epoch {:>2}/{}  train loss {:.4f}  test accuracy {:.4f}  {:.2f} s  {:.0f} samples/s  "
                 "communication {:.1f}%\n",
                 e.epoch, s.epochs, e.train_loss, e.test_accuracy, e.seconds, e.samples_per_second, 100 * e.comm_share);
      std::fflush(stdout);
    };
  }
  std::vector<fashion_mnist_gpu::epoch_report> epochs;
  if (o.collective == "nccl") {
    // The TCP group carries NCCL's unique id, then steps aside.
    dtrain::communicator<dtrain::tcp_transport> host(std::move(tcp));
    auto nccl = dtrain::nccl_communicator::over(host);
    epochs = fashion_mnist_gpu::train_over_nccl(std::move(nccl), s, train_view, test_view, report);
  } else {
    dtrain::cuda::check(cudaSetDevice(dtrain::cuda::local_device()), "cudaSetDevice");  // a host's ranks in turn
    epochs =
        fashion_mnist_gpu::train_over_staged(dtrain::any_transport(std::move(tcp)), s, train_view, test_view, report);
  }
  if (rank != 0) return 0;
  double seconds = 0, samples = 0;
  for (const auto& e : epochs) {
    seconds += e.seconds;
    samples += e.samples_per_second * e.seconds;
  }
  const double accuracy = epochs.back().test_accuracy;
  fmt::print("final test accuracy {:.4f}; {:.0f} samples/s over {} epochs on {} ranks ({})\n", accuracy,
             samples / seconds, epochs.size(), size, o.collective);
  return accuracy >= o.min_accuracy ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  fashion_mnist_gpu::settings s;
  CLI::App app{"Fashion-MNIST MLP on the GPU (cuBLAS), trained by dtrain's allreduce trainer (launch with dtrain-run)"};
  app.add_option("--data", o.data, "directory of the IDX files (.gz or plain)")->capture_default_str();
  app.add_option("--collective", o.collective, "nccl (one rank per GPU) or staged (TCP; ranks may share a GPU)")
      ->check(CLI::IsMember({"nccl", "staged"}))->capture_default_str();
  app.add_option("--epochs", s.epochs, "passes over the training set")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--batch", s.global_batch, "global batch (split across ranks)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--lr", s.lr, "learning rate")->capture_default_str();
  app.add_option("--momentum", s.momentum, "momentum")->capture_default_str();
  app.add_option("--hidden", o.hidden, "hidden layer widths")->delimiter(',')->capture_default_str();
  app.add_option("--first-bucket-kib", o.first_bucket_kib, "first gradient bucket")->capture_default_str();
  app.add_option("--bucket-mib", o.bucket_mib, "other gradient buckets")->capture_default_str();
  app.add_flag("--no-overlap", o.no_overlap, "allreduce after the backward pass instead of during it");
  app.add_option("--log-every", s.log_every, "steps between progress lines (0: none)")->capture_default_str();
  app.add_option("--limit-train", o.limit_train, "use only the first N training samples (0: all)");
  app.add_option("--seed", s.seed, "initialisation and shuffling seed")->capture_default_str();
  app.add_option("--min-accuracy", o.min_accuracy, "exit with status 3 below this test accuracy (77: no GPU)");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o, s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fashion_mnist_gpu: %s\n", e.what());
    return 1;
  }
}
