// Statements given an NCCL communicator, a host one (`host_comm`) and n floats of device memory at
// `device_ptr` (compiled only, as host code against the CUDA runtime's and NCCL's headers); after
// the block, the check that the host communicator refuses device memory.
// links: dtrain::nccl
// needs: nccl
#include <cstddef>

#include <dtrain/collective/communicator.hpp>
#include <dtrain/collective/nccl.hpp>
#include <dtrain/core/memory_space.hpp>
#include <dtrain/transport/inproc.hpp>

using host_comm_t = dtrain::communicator<dtrain::inproc_transport>;

template <class Collective, class Buffer>
concept allreduces = requires(Collective& c, Buffer b) { c.allreduce(b, dtrain::reduce_op::sum); };

#pragma GCC diagnostic ignored "-Wunused-parameter"
void doc_block(dtrain::nccl_communicator& nccl, host_comm_t& host_comm, float* device_ptr, std::size_t n) {
// @block@
  static_assert(allreduces<dtrain::nccl_communicator, dtrain::device_span<float>>);
  static_assert(!allreduces<host_comm_t, dtrain::device_span<float>>, "a host communicator took device memory");
}
