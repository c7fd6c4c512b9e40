// Tensor-parallel layers on Thrust's device memory (`thrust_kernels`) under Thrust's CPP system,
// where device memory is host memory: the code a CUDA build runs on the GPU. An MLP block
// (column layer, tanh, row layer) over 1-4 and 8 staged ranks (one then holding no hidden
// feature), with and without sequence parallelism, outputs starting as NaN,
// gives the host layers' bits (`loop_kernels` over the same collective) for the output, the
// input gradient and every parameter gradient (accumulated over two backward passes), and the
// unsplit block's values within 1e-12;
// ranks building different shapes are refused on every rank, through device memory.

#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../catch.hpp"
#include "dtrain/collective/staged.hpp"
#include "dtrain/tensor_parallel/device_kernels.hpp"
#include "dtrain/tensor_parallel/linear.hpp"
#include "dtrain/transport/inproc.hpp"
#include "unsplit.hpp"

using namespace dtrain;
using namespace dtrain::testing;
namespace tp = dtrain::tensor_parallel;
using staged_t = staged_communicator<inproc_transport>;

namespace {

static_assert(std::same_as<tp::memory_of<tp::thrust_kernels>, tp::thrust_tensors>);
static_assert(std::same_as<tp::memory_of<tp::loop_kernels>, tp::host_tensors>);

// What one rank computed: its rows of the output and of the input gradient, and its slices of the
// four parameter gradients, side by side (host copies).
using rank_values = std::vector<std::vector<double>>;

template <class Span>
std::vector<double> copy_of(Span s) {  // under the CPP system a device span is host memory
  return {s.begin(), s.end()};
}

// The block on `p` ranks with `Kernels`' layers and memory; sequence parallel or not.
template <class Kernels>
std::vector<rank_values> run_block(const unsplit& ref, int p, bool sequence) {
  using memory = tp::memory_of<Kernels>;
  using buffer = typename memory::template buffer<double>;
  std::vector<rank_values> out_all(static_cast<std::size_t>(p));
  run_inproc(p, [&](int r, inproc_transport t) {
    staged_t group(std::move(t));
    const tp::layer_options options{sequence};
    tp::column_parallel_linear<double, staged_t, Kernels> fc1(group, in, hidden, options);
    tp::row_parallel_linear<double, staged_t, Kernels> fc2(group, hidden, out, options);
    fc1.load(ref.w1, ref.b1);
    fc2.load(ref.w2, ref.b2);
    const std::size_t width = fc1.outputs().size;
    const std::size_t rows = sequence ? ref.batch / static_cast<std::size_t>(p) : ref.batch;
    const std::size_t first = sequence ? static_cast<std::size_t>(r) * rows : 0;
    auto device_rows = [&](const std::vector<double>& whole, std::size_t w) {
      buffer b = memory::template allocate<double>(rows * w);
      memory::upload(memory::whole(b), std::span<const double>(whole).subspan(first * w, rows * w));
      return b;
    };
    buffer x = device_rows(ref.x, in), dy = device_rows(ref.dy, out);
    // Outputs start as NaN: a layer that adds to what it should overwrite (or leaves a part unwritten)
    // shows. (Under the CPP system device memory is host memory, so the test writes it directly.)
    auto garbage = [](std::size_t n) {
      buffer b = memory::template allocate<double>(n);
      for (double& v : memory::whole(b)) v = std::numeric_limits<double>::quiet_NaN();
      return b;
    };
    buffer h = garbage(ref.batch * width), y = garbage(rows * out), dh = garbage(ref.batch * width);
    buffer dx = garbage(rows * in);
    auto view = [](buffer& b) { return typename memory::template span<const double>(memory::whole(b)); };

    for (int pass = 0; pass < 2; ++pass) {  // forward overwrites: the second pass gives the first's bits
      fc1.forward(view(x), memory::whole(h));
      for (double& v : memory::whole(h)) v = std::tanh(v);  // the model's activation
      fc2.forward(view(h), memory::whole(y));
    }
    for (int pass = 0; pass < 2; ++pass) {  // the parameter gradients accumulate: twice the one pass's
      fc2.backward(view(h), view(dy), memory::whole(dh));
      const auto hv = memory::whole(h);
      auto dhv = memory::whole(dh);
      for (std::size_t i = 0; i < dhv.size(); ++i) dhv[i] *= 1 - hv[i] * hv[i];
      fc1.backward(view(x), view(dh), memory::whole(dx));
    }
    fc1.backward(view(x), view(dh), {});  // no input gradient wanted: fc1's gradients three times over

    rank_values& mine = out_all[static_cast<std::size_t>(r)];
    mine = {copy_of(memory::whole(y)), copy_of(memory::whole(dx))};
    for (auto* p_ : {&fc1.parameters(), &fc2.parameters()}) {
      mine.push_back(copy_of(memory::whole(p_->weight_grad)));
      mine.push_back(copy_of(memory::whole(p_->bias_grad)));
    }
  });
  return out_all;
}

bool near(double got, double want) { return std::abs(got - want) <= 1e-12 * std::max(1.0, std::abs(want)); }

}  // namespace

TEST_CASE("tensor parallel on device memory: the host layers' bits, and the unsplit block",
          "[tensor_parallel][device]") {
  const unsplit ref(24);  // 24 rows: whole shares on 1-4 and 8 ranks
  for (const bool sequence : {false, true}) {
    for (const int p : {1, 2, 3, 4, 8}) {  // on 8 ranks one holds none of the 7 hidden features
      INFO((sequence ? "sequence parallel, " : "") << p << " ranks");
      const auto device = run_block<tp::thrust_kernels>(ref, p, sequence);
      REQUIRE(device == run_block<tp::loop_kernels>(ref, p, sequence));
      for (int r = 0; r < p; ++r) {
        const rank_values& v = device[static_cast<std::size_t>(r)];
        const tp::slice mine = tp::slice_of(hidden, r, p);
        const std::size_t rows = sequence ? ref.batch / static_cast<std::size_t>(p) : ref.batch;
        const std::size_t first = sequence ? static_cast<std::size_t>(r) * rows : 0;
        for (std::size_t i = 0; i < rows * out; ++i) REQUIRE(near(v[0][i], ref.y[first * out + i]));
        for (std::size_t i = 0; i < rows * in; ++i) REQUIRE(near(v[1][i], ref.dx[first * in + i]));
        for (std::size_t j = 0; j < mine.size; ++j) {  // fc1's three passes, fc2's two
          for (std::size_t i = 0; i < in; ++i) REQUIRE(near(v[2][j * in + i], 3 * ref.gw1[(mine.begin + j) * in + i]));
          REQUIRE(near(v[3][j], 3 * ref.gb1[mine.begin + j]));
          for (std::size_t o = 0; o < out; ++o) {
            REQUIRE(near(v[4][o * mine.size + j], 2 * ref.gw2[o * hidden + mine.begin + j]));
          }
        }
        for (std::size_t o = 0; o < out; ++o) REQUIRE(near(v[5][o], 2 * ref.gb2[o]));
      }
    }
  }
}

TEST_CASE("tensor parallel on device memory: ranks that build different shapes are refused on every rank",
          "[tensor_parallel][device]") {
  std::vector<std::string> errors(3);
  run_inproc(3, [&](int r, inproc_transport t) {
    staged_t group(std::move(t));
    try {
      tp::column_parallel_linear<double, staged_t, tp::thrust_kernels> fc(group, in, r == 2 ? 14 : 12);
    } catch (const error& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  for (const std::string& e : errors) {
    CHECK(e.find("column_parallel_linear: the tensor-parallel group's ranks disagree on the layer's shape: rank 0 "
                 "builds 5 -> 12, rank 2 builds 5 -> 14") != std::string::npos);
  }
}
