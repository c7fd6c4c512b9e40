// Statements given a rendezvous store (the file store), this rank and the group's size, and n
// floats of device memory at `grads` (compiled only, as host code against the CUDA runtime's and
// NCCL's headers).
// links: dtrain::nccl
// needs: nccl
#include <cstddef>

#include <dtrain/collective/nccl.hpp>
#include <dtrain/rendezvous/file_store.hpp>

void doc_block(dtrain::file_store& store, int rank, int size, float* grads, std::size_t n) {
// @block@
}
