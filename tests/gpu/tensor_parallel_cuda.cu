// The tensor-parallel layers on the GPU: an MLP block (column layer, tanh, row layer) over 1-3 and
// 8 staged ranks sharing one device, outputs starting as NaN, two backward passes, its tensors in device memory, with
// Thrust's kernels and with cuBLAS's, plain and sequence parallel: the output, the input gradient and every parameter
// gradient equal the unsplit block's within 1e-12 relative (double; cuBLAS sums in its own order)
// and 1e-4 (float).

#include <cmath>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include <thrust/transform.h>

#include "../catch.hpp"
#include "../tensor_parallel/unsplit.hpp"
#include "dtrain/collective/staged.hpp"
#include "dtrain/tensor_parallel/cublas_kernels.hpp"
#include "dtrain/tensor_parallel/device_kernels.hpp"
#include "dtrain/tensor_parallel/linear.hpp"
#include "dtrain/transport/inproc.hpp"
#include "gpu.hpp"

using namespace dtrain;
using namespace dtrain::testing;
namespace tp = dtrain::tensor_parallel;
using staged_t = staged_communicator<inproc_transport>;
namespace space = dtrain::detail::thrust_space;

namespace {

template <class T>
struct tanh_op {
  DTRAIN_HOST_DEVICE T operator()(T v) const { return tanh(v); }
};
template <class T>
struct tanh_backward_op {  // dh * (1 - h^2)
  DTRAIN_HOST_DEVICE T operator()(T dh, T h) const { return dh * (T(1) - h * h); }
};

std::vector<double> widened(const std::vector<float>& v) { return {v.begin(), v.end()}; }
std::vector<double> widened(const std::vector<double>& v) { return v; }

// Every rank's output, input gradient and parameter gradients (host copies, as double), on `p`
// ranks with `Kernels`.
template <class T, class Kernels>
std::vector<std::vector<std::vector<double>>> run_block(const unsplit& ref, int p, bool sequence) {
  std::vector<std::vector<std::vector<double>>> all(static_cast<std::size_t>(p));
  std::vector<std::string> errors(static_cast<std::size_t>(p));
  run_inproc(p, [&](int r, inproc_transport t) {
    try {
      staged_t group(std::move(t));
      const tp::layer_options options{sequence};
      tp::column_parallel_linear<T, staged_t, Kernels> fc1(group, in, hidden, options);
      tp::row_parallel_linear<T, staged_t, Kernels> fc2(group, hidden, out, options);
      auto narrow = [](const std::vector<double>& v) { return std::vector<T>(v.begin(), v.end()); };
      fc1.load(narrow(ref.w1), narrow(ref.b1));
      fc2.load(narrow(ref.w2), narrow(ref.b2));
      const std::size_t width = fc1.outputs().size;
      const std::size_t rows = sequence ? ref.batch / static_cast<std::size_t>(p) : ref.batch;
      const std::size_t first = sequence ? static_cast<std::size_t>(r) * rows : 0;
      auto device_rows = [&](const std::vector<double>& whole, std::size_t w) {
        const std::vector<T> mine = narrow(std::vector<double>(whole.begin() + first * w,
                                                               whole.begin() + (first + rows) * w));
        space::buffer<T> b(mine.size());
        space::upload<T>(b.span(), mine, {});
        return b;
      };
      space::buffer<T> x = device_rows(ref.x, in), dy = device_rows(ref.dy, out);
      space::buffer<T> h(ref.batch * width), y(rows * out), dh(ref.batch * width), dx(rows * in);
      for (auto* b : {&h, &y, &dh, &dx}) {  // NaN: what a layer should overwrite and adds to shows
        dtrain::cuda::check(cudaMemset(b->data(), 0xFF, b->size() * sizeof(T)), "cudaMemset");
      }
      auto view = [](space::buffer<T>& b) { return thrust_buffer<const T>(b.span()); };
      const auto on = space::on({});
      fc1.forward(view(x), h.span());
      thrust::transform(on, h.data(), h.data() + h.size(), h.data(), tanh_op<T>{});
      fc2.forward(view(h), y.span());
      for (int pass = 0; pass < 2; ++pass) {  // the parameter gradients accumulate: twice one pass's
        fc2.backward(view(h), view(dy), dh.span());
        thrust::transform(on, dh.data(), dh.data() + dh.size(), h.data(), dh.data(), tanh_backward_op<T>{});
        fc1.backward(view(x), view(dh), dx.span());
      }
      auto& mine = all[static_cast<std::size_t>(r)];
      for (auto* b : {&y, &dx, &fc1.parameters().weight_grad, &fc1.parameters().bias_grad,
                      &fc2.parameters().weight_grad, &fc2.parameters().bias_grad}) {
        mine.push_back(widened(space::to_host<T>(thrust_buffer<const T>(b->span()), {})));
      }
    } catch (const std::exception& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  for (const std::string& e : errors) REQUIRE(e.empty());
  return all;
}

template <class T, class Kernels>
void check_block(double tolerance) {
  const unsplit ref(24);  // whole shares on 1-3 and 8 ranks
  auto near = [&](double got, double want) {
    return std::abs(got - want) <= tolerance * std::max(1.0, std::abs(want));
  };
  for (const bool sequence : {false, true}) {
    for (const int p : {1, 2, 3, 8}) {  // on 8 ranks one holds none of the 7 hidden features
      INFO((sequence ? "sequence parallel, " : "") << p << " ranks");
      const auto got = run_block<T, Kernels>(ref, p, sequence);
      for (int r = 0; r < p; ++r) {
        const auto& v = got[static_cast<std::size_t>(r)];
        const tp::slice mine = tp::slice_of(hidden, r, p);
        const std::size_t rows = sequence ? ref.batch / static_cast<std::size_t>(p) : ref.batch;
        const std::size_t first = sequence ? static_cast<std::size_t>(r) * rows : 0;
        for (std::size_t i = 0; i < rows * out; ++i) REQUIRE(near(v[0][i], ref.y[first * out + i]));
        for (std::size_t i = 0; i < rows * in; ++i) REQUIRE(near(v[1][i], ref.dx[first * in + i]));
        for (std::size_t j = 0; j < mine.size; ++j) {  // two passes' gradients
          for (std::size_t i = 0; i < in; ++i) REQUIRE(near(v[2][j * in + i], 2 * ref.gw1[(mine.begin + j) * in + i]));
          REQUIRE(near(v[3][j], 2 * ref.gb1[mine.begin + j]));
          for (std::size_t o = 0; o < out; ++o) {
            REQUIRE(near(v[4][o * mine.size + j], 2 * ref.gw2[o * hidden + mine.begin + j]));
          }
        }
        for (std::size_t o = 0; o < out; ++o) REQUIRE(near(v[5][o], 2 * ref.gb2[o]));
      }
    }
  }
}

}  // namespace

TEST_CASE("tensor parallel on the GPU: Thrust's kernels give the unsplit block", "[gpu][tensor_parallel]") {
  DTRAIN_REQUIRE_GPUS(1);
  check_block<double, tp::thrust_kernels>(1e-12);
  check_block<float, tp::thrust_kernels>(1e-4);
}

TEST_CASE("tensor parallel on the GPU: cuBLAS's kernels give the unsplit block", "[gpu][tensor_parallel]") {
  DTRAIN_REQUIRE_GPUS(1);
  check_block<double, tp::cublas_kernels>(1e-12);
  check_block<float, tp::cublas_kernels>(1e-4);
}
