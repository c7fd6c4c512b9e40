// dtrain's Thrust reduction on the GPU (CUDA system): every op, float and double, on device
// buffers, against a host reference; enqueued on a stream (stream_reduction) and with the
// default synchronising policy. Each element is combined once, so results are exact.

#include <algorithm>
#include <random>
#include <vector>

#include "../catch.hpp"
#include "dtrain/concepts/reduction.hpp"
#include "dtrain/reduce/thrust.hpp"
#include "gpu.hpp"

using namespace dtrain;

static_assert(std::is_same_v<thrust_reduction<>::memory_space, device_memory>);
static_assert(reduction<thrust_reduction<>, float>);

namespace {

template <class T>
void check_all_ops(bool on_stream) {
  const std::size_t n = 100003;  // not a multiple of any block size
  std::mt19937 gen(7);
  std::uniform_int_distribution<int> pick(-50, 50);
  std::vector<T> a(n), b(n);
  for (std::size_t i = 0; i < n; ++i) {
    a[i] = static_cast<T>(pick(gen)) / 4;
    b[i] = static_cast<T>(pick(gen)) / 8;
  }
  dtrain::cuda::device_buffer<T> da(n), db(n);
  dtrain::cuda::stream s;
  for (reduce_op op : {reduce_op::sum, reduce_op::prod, reduce_op::min, reduce_op::max}) {
    // The inputs go up on `s`: a pageable cudaMemcpy may return before its copy lands, and `s`
    // is not ordered with the legacy default stream it would use.
    dtrain::cuda::check(cudaMemcpyAsync(da.data(), a.data(), n * sizeof(T), cudaMemcpyHostToDevice, s.get()), "H2D");
    dtrain::cuda::check(cudaMemcpyAsync(db.data(), b.data(), n * sizeof(T), cudaMemcpyHostToDevice, s.get()), "H2D");
    if (on_stream) {
      stream_reduction(s.get())(da.span(), device_span<const T>(db.span()), op);
      s.synchronize();
    } else {
      s.synchronize();
      thrust_reduction<>{}(da.span(), device_span<const T>(db.span()), op);
    }
    std::vector<T> got(n);
    dtrain::cuda::check(cudaMemcpy(got.data(), da.data(), n * sizeof(T), cudaMemcpyDeviceToHost), "D2H");
    std::size_t wrong = 0, first = n;
    for (std::size_t i = 0; i < n; ++i) {
      const T want = op == reduce_op::sum ? a[i] + b[i] : op == reduce_op::prod ? a[i] * b[i]
                   : op == reduce_op::min ? std::min(a[i], b[i]) : std::max(a[i], b[i]);
      if (got[i] != want && wrong++ == 0) first = i;
    }
    INFO(reduce_op_name(op) << " on " << sizeof(T) * 8 << "-bit floats, "
                            << (on_stream ? "stream-ordered" : "synchronising") << ": first wrong element " << first);
    CHECK(wrong == 0);
  }
}

}  // namespace

TEST_CASE("thrust_reduction on the GPU: every op matches the host, synchronising and stream-ordered", "[gpu][thrust]") {
  DTRAIN_REQUIRE_GPUS(1);
  check_all_ops<float>(false);
  check_all_ops<double>(false);
  check_all_ops<float>(true);
  check_all_ops<double>(true);
}
