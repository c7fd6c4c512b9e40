// Statements given an NCCL communicator, a host one (`host_comm`), n floats of device memory at
// `device_ptr` and a host vector (compiled only, as host code against the CUDA runtime's and
// NCCL's headers); after the block, the checks that the two lines it shows as errors are refused.
// links: dtrain::nccl
// needs: nccl
#include <cstddef>
#include <span>
#include <vector>

#include <dtrain/collective/communicator.hpp>
#include <dtrain/collective/nccl.hpp>
#include <dtrain/core/memory_space.hpp>
#include <dtrain/transport/inproc.hpp>

using host_comm_t = dtrain::communicator<dtrain::inproc_transport>;

template <class Collective, class Buffer>
concept allreduces = requires(Collective& c, Buffer b) { c.allreduce(b, dtrain::reduce_op::sum); };

#pragma GCC diagnostic ignored "-Wunused-parameter"
void doc_block(dtrain::nccl_communicator& nccl, host_comm_t& host_comm, float* device_ptr, std::size_t n,
               std::vector<float>& host_vec) {
// @block@
  static_assert(allreduces<dtrain::nccl_communicator, dtrain::device_span<float>>);
  static_assert(!allreduces<host_comm_t, dtrain::device_span<float>>, "a host communicator took device memory");
  static_assert(!allreduces<dtrain::nccl_communicator, std::span<float>>, "NCCL took host memory");
}
