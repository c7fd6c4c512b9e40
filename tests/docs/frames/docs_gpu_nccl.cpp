// Statements given a rendezvous store (the file store), this rank, the group's size, a host
// collective every rank holds (`host_comm`) and n floats of device memory at `grads` (compiled
// only, as host code against the CUDA runtime's and NCCL's headers).
// links: dtrain::nccl
// needs: nccl
#include <cstddef>

#include <dtrain/collective/communicator.hpp>
#include <dtrain/collective/nccl.hpp>
#include <dtrain/rendezvous/file_store.hpp>
#include <dtrain/transport/inproc.hpp>

void doc_block(dtrain::file_store& store, int rank, int size, dtrain::communicator<dtrain::inproc_transport>& host_comm,
               float* grads, std::size_t n) {
// @block@
}
