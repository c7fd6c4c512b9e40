// Statements given a rendezvous store (the file store), this rank, the group's size, two
// neighbouring ranks and n floats of device memory at `activation` and at `incoming` (compiled
// only, as host code against the CUDA runtime's and NCCL's headers).
// links: dtrain::nccl
// needs: nccl
#include <chrono>
#include <cstddef>

#include <dtrain/collective/nccl.hpp>
#include <dtrain/rendezvous/file_store.hpp>

void doc_block(dtrain::file_store& store, int rank, int size, int next, int prev, const float* activation,
               float* incoming, std::size_t n) {
// @block@
}
