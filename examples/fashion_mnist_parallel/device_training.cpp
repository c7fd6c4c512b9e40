// fashion_mnist_parallel_device's training, on Thrust's device memory: compiled by the C++
// compiler under Thrust's CPP system (the CPU build, which CI runs), and by nvcc in a CUDA build
// (device_training.cu includes this file).

#include "device_training.hpp"

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include <dtrain/collective/staged.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/pipeline/device_link.hpp>
#include <dtrain/tensor_parallel/device_kernels.hpp>
#include <dtrain/transport/group.hpp>
#include <dtrain/updater/device.hpp>
#include <dtrain/updater/momentum.hpp>
#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
#include <dtrain/cuda/runtime.hpp>
#include <dtrain/tensor_parallel/cublas_kernels.hpp>
#endif
#if DTRAIN_EXAMPLE_NCCL
#include <dtrain/collective/communicator.hpp>
#include <dtrain/collective/nccl.hpp>
#endif

#include "device_stage.hpp"
#include "training.hpp"

namespace fashion_mnist {

namespace {

// Device memory: every collective (pipeline messages, tp and dp) stages device buffers over the
// ranks' process groups; the stages' products are `Kernels`'.
template <class Kernels>
struct device_layout {
  using transport = dtrain::any_transport;
  using group = dtrain::process_group<transport>;
  using pp_collective = dtrain::staged_communicator<group>;
  using tp_collective = dtrain::staged_communicator<group>;
  using dp_collective = dtrain::staged_communicator<group>;
  using stage = device_parallel_stage<tp_collective, Kernels>;
  using updater = dtrain::device_updater<dtrain::momentum<float>>;
  static constexpr const char* memory =
      THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA ? "the GPU" : "device memory (Thrust's CPP system: the CPU)";
};

#if DTRAIN_EXAMPLE_NCCL
// A GPU per rank: every collective an NCCL communicator on its axis's ranks, formed over the
// axis's process group (which carries rank 0's unique id); the pp axis's with point-to-point lanes.
template <class Kernels>
struct nccl_layout {
  using transport = dtrain::any_transport;
  using group = dtrain::process_group<transport>;
  using pp_collective = dtrain::nccl_communicator;
  using tp_collective = dtrain::nccl_communicator;
  using dp_collective = dtrain::nccl_communicator;
  using stage = device_parallel_stage<tp_collective, Kernels>;
  using updater = dtrain::device_updater<dtrain::momentum<float>>;
  static constexpr const char* memory = "the GPU (NCCL)";

  template <class C>
  static C form(group ranks, std::string_view axis) {
    dtrain::nccl_options o;
    dtrain::cuda::check(cudaGetDevice(&o.device), "cudaGetDevice");  // train_on_device's, whatever the axis rank
    o.point_to_point = axis == "pp";
    dtrain::communicator<group> host(std::move(ranks));
    return C::over(host, o);
  }
};
#endif

template <template <class> class Layout, class Kernels>
int run(const settings& s, dtrain::any_transport world, const split& train_set, const split& test) {
  return with_schedule(s, [&](auto schedule) {
    return train<Layout<Kernels>>(s, schedule, std::move(world), train_set, test, "fashion_mnist_parallel_device");
  });
}

template <class Kernels>
int run(const settings& s, dtrain::any_transport world, const split& train_set, const split& test) {
#if DTRAIN_EXAMPLE_NCCL
  if (s.comm == "nccl") return run<nccl_layout, Kernels>(s, std::move(world), train_set, test);
#else
  if (s.comm == "nccl") {
    throw dtrain::error(dtrain::errc::invalid_argument,
                        "--comm nccl: this build has no NCCL (build with CUDA and NCCL; --comm staged runs here)");
  }
#endif
  return run<device_layout, Kernels>(s, std::move(world), train_set, test);
}

}  // namespace

int train_on_device(const settings& s, dtrain::any_transport world, const split& train_set, const split& test) {
#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
  if (dtrain::cuda::device_count() == 0) {
    std::fprintf(stderr, "fashion_mnist_parallel_device: no CUDA device is visible: this build needs a GPU "
                         "(a CPU build runs the same code under Thrust's CPP system)\n");
    return exit_no_device;
  }
  dtrain::cuda::check(cudaSetDevice(dtrain::cuda::local_device()), "cudaSetDevice");  // a host's ranks in turn
#endif
  if (s.kernels == "thrust") return run<dtrain::tensor_parallel::thrust_kernels>(s, std::move(world), train_set, test);
#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
  if (s.kernels == "cublas") return run<dtrain::tensor_parallel::cublas_kernels>(s, std::move(world), train_set, test);
#endif
  throw dtrain::error(
      dtrain::errc::invalid_argument,
      "--kernels " + s.kernels + ": this build has thrust" +
          (THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA ? ", cublas" : " (cublas needs a CUDA build)"));
}

}  // namespace fashion_mnist
