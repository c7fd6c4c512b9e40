// The program docs/gpu.md's CUDA consumer block builds (tests/cmake/run_doc_consumer.cmake):
// two device buffers summed with dtrain's Thrust reduction, checked on the host.
#include <dtrain/cuda/runtime.hpp>
#include <dtrain/reduce/thrust.hpp>

#include <cstdio>
#include <vector>

int main() {
  const std::size_t n = 1000;
  std::vector<float> a(n, 1.0f), b(n, 2.0f);
  dtrain::cuda::device_buffer<float> da(n), db(n);
  dtrain::cuda::check(cudaMemcpy(da.data(), a.data(), n * sizeof(float), cudaMemcpyHostToDevice), "upload a");
  dtrain::cuda::check(cudaMemcpy(db.data(), b.data(), n * sizeof(float), cudaMemcpyHostToDevice), "upload b");
  dtrain::thrust_reduction<>{}(da.span(), dtrain::device_span<const float>(db.span()), dtrain::reduce_op::sum);
  dtrain::cuda::check(cudaMemcpy(a.data(), da.data(), n * sizeof(float), cudaMemcpyDeviceToHost), "download");
  bool ok = true;
  for (float x : a) ok = ok && x == 3.0f;
  std::printf("gpu_app: %s\n", ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
