// Tensor-parallel layers against the unsplit layer: a column-parallel layer, tanh and a
// row-parallel layer (an MLP block) split over 1-4 ranks give the unsplit block's output, input
// gradient and parameter gradients (each rank its slice), within 1e-12 relative (the row
// layer's partial products are summed across ranks in the allreduce's order, not the unsplit
// loop's); with exactly one allreduce forward and one backward.

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "../catch.hpp"
#include "unsplit.hpp"
#include "dtrain/collective/communicator.hpp"
#include "dtrain/tensor_parallel/linear.hpp"
#include "dtrain/transport/inproc.hpp"

using namespace dtrain;
using namespace dtrain::testing;
namespace tp = dtrain::tensor_parallel;

namespace {

// The tensor-parallel group's communicator, counting its allreduces.
struct counting {
  communicator<inproc_transport>& c;
  int allreduces = 0;
  int rank() const noexcept { return c.rank(); }
  int size() const noexcept { return c.size(); }
  void allreduce(std::span<double> v, reduce_op op) {
    ++allreduces;
    c.allreduce(v, op);
  }
  void allgather(std::span<const std::int64_t> mine, std::span<std::int64_t> all) { c.allgather(mine, all); }
};

// The same for sequence parallelism, counting its allgathers and reduce-scatters of values too.
struct counting_sequence : counting {
  int allgathers = 0, reduce_scatters = 0;
  using counting::allgather;
  void allgather(std::span<const double> mine, std::span<double> all) {
    ++allgathers;
    c.allgather(mine, all);
  }
  void reduce_scatter(std::span<const double> whole, std::span<double> mine, reduce_op op) {
    ++reduce_scatters;
    c.reduce_scatter(whole, mine, op);
  }
};

static_assert(!tp::detail::sequence_collective<counting, std::span<const double>, std::span<double>>);
static_assert(tp::detail::sequence_collective<counting_sequence, std::span<const double>, std::span<double>>);

// Checks made on rank threads: counted, the first failure described (Catch2 asserts on the main
// thread only).
struct expectations {
  std::atomic<int> wrong{0}, checked{0};
  std::string first;
  std::mutex mu;
  void operator()(bool ok, const std::string& what) {
    ++checked;
    if (ok) return;
    ++wrong;
    std::lock_guard lock(mu);
    if (first.empty()) first = what;
  }
};

bool near(double got, double want) { return std::abs(got - want) <= 1e-12 * std::max(1.0, std::abs(want)); }

// This rank's slices of both layers' parameter gradients, and fc2's whole bias gradient, against
// the unsplit block's.
template <class Fc1, class Fc2>
void check_parameter_gradients(Fc1& fc1, Fc2& fc2, const unsplit& ref, expectations& expect) {
  const tp::slice mine = fc1.outputs();
  for (std::size_t j = 0; j < mine.size; ++j) {
    expect(near(fc1.parameters().bias_grad[j], ref.gb1[mine.begin + j]), "fc1 bias gradient");
    for (std::size_t i = 0; i < in; ++i)
      expect(near(fc1.parameters().weight_grad[j * in + i], ref.gw1[(mine.begin + j) * in + i]), "fc1 weight gradient");
    for (std::size_t o = 0; o < out; ++o)
      expect(near(fc2.parameters().weight_grad[o * mine.size + j], ref.gw2[o * hidden + mine.begin + j]),
             "fc2 weight gradient");
  }
  for (std::size_t o = 0; o < out; ++o) expect(near(fc2.parameters().bias_grad[o], ref.gb2[o]), "fc2 bias gradient");
}

}  // namespace

TEST_CASE("tensor parallel: an MLP block split over 1-4 ranks equals the unsplit block", "[tensor_parallel]") {
  const unsplit ref;
  for (int p = 1; p <= 4; ++p) {
    expectations expect;
    // What the group holds whole on every rank (the output, the input gradient, fc2's bias
    // gradient), raw: the same bits on every rank, not only near the unsplit block's.
    std::vector<std::vector<std::byte>> whole(static_cast<std::size_t>(p));
    run_inproc(p, [&](int r, inproc_transport t) {
      communicator<inproc_transport> comm(std::move(t));
      counting group{comm};
      tp::column_parallel_linear<double, counting> fc1(group, in, hidden);
      tp::row_parallel_linear<double, counting> fc2(group, hidden, out);
      fc1.load(ref.w1, ref.b1);
      fc2.load(ref.w2, ref.b2);
      const tp::slice mine = fc1.outputs();
      expect(mine.begin == fc2.inputs().begin && mine.size == fc2.inputs().size, "the two layers split hidden alike");

      std::vector<double> h(ref.batch * mine.size), y(ref.batch * out);
      fc1.forward(ref.x, h);
      for (double& v : h) v = std::tanh(v);
      fc2.forward(h, y);
      expect(group.allreduces == (p > 1 ? 1 : 0), "one allreduce forward");
      for (std::size_t i = 0; i < y.size(); ++i)
        expect(near(y[i], ref.y[i]), "rank " + std::to_string(r) + " output " + std::to_string(i));

      std::vector<double> dh(h.size()), dx(ref.batch * in);
      fc2.backward(h, ref.dy, dh);
      for (std::size_t i = 0; i < dh.size(); ++i) dh[i] *= 1 - h[i] * h[i];
      fc1.backward(ref.x, dh, dx);
      expect(group.allreduces == (p > 1 ? 2 : 0), "one allreduce backward");
      for (std::size_t i = 0; i < dx.size(); ++i) expect(near(dx[i], ref.dx[i]), "input gradient " + std::to_string(i));
      check_parameter_gradients(fc1, fc2, ref, expect);
      auto& mine_whole = whole[static_cast<std::size_t>(r)];
      for (std::span<const std::byte> b : {std::as_bytes(std::span(y)), std::as_bytes(std::span(dx)),
                                           std::as_bytes(std::span(fc2.parameters().bias_grad))}) {
        mine_whole.insert(mine_whole.end(), b.begin(), b.end());
      }
    });
    INFO("p " << p << ": " << expect.first);
    CHECK(expect.wrong.load() == 0);
    CHECK(expect.checked.load() > 100);
    for (int r = 1; r < p; ++r) {
      INFO("rank " << r << "'s output, input gradient and fc2 bias gradient against rank 0's");
      CHECK(whole[static_cast<std::size_t>(r)] == whole[0]);
    }
  }
}

TEST_CASE("tensor parallel: sequence parallelism splits the block's rows and still equals the unsplit block",
          "[tensor_parallel]") {
  const unsplit ref(12);  // 12 rows: whole shares on 1-4 ranks
  for (int p = 1; p <= 4; ++p) {
    std::vector<std::vector<std::byte>> bias_bits(static_cast<std::size_t>(p));  // fc2's, whole on every rank
    expectations expect;
    run_inproc(p, [&](int r, inproc_transport t) {
      communicator<inproc_transport> comm(std::move(t));
      counting_sequence group{{comm}};
      const tp::layer_options sp{true};
      tp::column_parallel_linear<double, counting_sequence> fc1(group, in, hidden, sp);
      tp::row_parallel_linear<double, counting_sequence> fc2(group, hidden, out, sp);
      fc1.load(ref.w1, ref.b1);
      fc2.load(ref.w2, ref.b2);
      const tp::slice mine = fc1.outputs();
      const std::size_t rows = ref.batch / static_cast<std::size_t>(p), first_row = static_cast<std::size_t>(r) * rows;
      auto my_rows = [&](const std::vector<double>& whole, std::size_t width) {
        return std::vector<double>(whole.begin() + static_cast<std::ptrdiff_t>(first_row * width),
                                   whole.begin() + static_cast<std::ptrdiff_t>((first_row + rows) * width));
      };
      const std::vector<double> x = my_rows(ref.x, in);
      std::vector<double> h(ref.batch * mine.size), y(rows * out);
      fc1.forward(x, h);
      for (double& v : h) v = std::tanh(v);
      fc2.forward(h, y);
      expect(group.allreduces == 0 && group.allgathers == 1 && group.reduce_scatters == 1,
             "forward: one allgather and one reduce-scatter, no allreduce");
      const std::vector<double> want_y = my_rows(ref.y, out);
      for (std::size_t i = 0; i < y.size(); ++i)
        expect(near(y[i], want_y[i]), "rank " + std::to_string(r) + " output " + std::to_string(i));

      std::vector<double> dh(h.size()), dx(rows * in);
      fc2.backward(h, my_rows(ref.dy, out), dh);
      for (std::size_t i = 0; i < dh.size(); ++i) dh[i] *= 1 - h[i] * h[i];
      fc1.backward(x, dh, dx);
      expect(group.allreduces == 0 && group.allgathers == 3 && group.reduce_scatters == 2,
             "backward: the output gradient and the input allgathered, the input gradient reduce-scattered");
      const std::vector<double> want_dx = my_rows(ref.dx, in);
      for (std::size_t i = 0; i < dx.size(); ++i)
        expect(near(dx[i], want_dx[i]), "input gradient " + std::to_string(i));
      check_parameter_gradients(fc1, fc2, ref, expect);
      const auto b = std::as_bytes(std::span(fc2.parameters().bias_grad));
      bias_bits[static_cast<std::size_t>(r)].assign(b.begin(), b.end());
    });
    INFO("p " << p << ": " << expect.first);
    CHECK(expect.wrong.load() == 0);
    CHECK(expect.checked.load() > 100);
    for (int r = 1; r < p; ++r) CHECK(bias_bits[static_cast<std::size_t>(r)] == bias_bits[0]);  // the same bits
  }
}

TEST_CASE("tensor parallel: sequence parallelism is refused over a collective without it, on rows that do not split, "
          "and a short input gradient anywhere",
          "[tensor_parallel]") {
  std::vector<std::string> no_column(2), no_row(2), uneven(2), short_dx(2);
  run_inproc(2, [&](int r, inproc_transport t) {
    communicator<inproc_transport> comm(std::move(t));
    const auto rz = static_cast<std::size_t>(r);
    counting plain{comm};
    try {
      tp::column_parallel_linear<double, counting> fc(plain, in, hidden, tp::layer_options{true});
    } catch (const dtrain::error& e) {
      no_column[rz] = e.what();
    }
    try {
      tp::row_parallel_linear<double, counting> fc(plain, hidden, out, tp::layer_options{true});
    } catch (const dtrain::error& e) {
      no_row[rz] = e.what();
    }
    counting_sequence group{{comm}};
    tp::row_parallel_linear<double, counting_sequence> fc2(group, hidden, out, tp::layer_options{true});
    const tp::slice mine = fc2.inputs();
    std::vector<double> h(3 * mine.size), y(out + out / 2);  // 3 rows over 2 ranks
    try {
      fc2.forward(h, y);
    } catch (const dtrain::error& e) {
      uneven[rz] = e.what();
    }
    // A short input gradient is refused before anything is written past its end.
    tp::row_parallel_linear<double, counting_sequence> fc3(group, hidden, out);
    std::vector<double> x(2 * mine.size), dy(2 * out), dx(1);
    try {
      fc3.backward(x, dy, dx);
    } catch (const dtrain::error& e) {
      short_dx[rz] = e.what();
    }
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK_THAT(no_column[static_cast<std::size_t>(r)],
               Catch::Contains("column_parallel_linear: sequence parallelism needs a collective with allgather"));
    CHECK_THAT(no_row[static_cast<std::size_t>(r)],
               Catch::Contains("row_parallel_linear: sequence parallelism needs a collective with allgather"));
    CHECK_THAT(uneven[static_cast<std::size_t>(r)], Catch::Contains("3 rows do not split over 2 ranks"));
    CHECK_THAT(short_dx[static_cast<std::size_t>(r)], Catch::Contains("the input gradient has 1 elements"));
  }
}

TEST_CASE("tensor parallel: slices cover the features once, the first ranks one larger", "[tensor_parallel]") {
  for (std::size_t count : {0u, 1u, 7u, 8u, 1024u}) {
    for (int ranks = 1; ranks <= 5; ++ranks) {
      std::size_t next = 0;
      for (int r = 0; r < ranks; ++r) {
        const tp::slice s = tp::slice_of(count, r, ranks);
        CHECK(s.begin == next);
        CHECK((s.size == count / ranks || s.size == count / ranks + 1));
        next += s.size;
      }
      CHECK(next == count);
    }
  }
  bool refused = false;
  run_inproc(1, [&](int, inproc_transport t) {
    communicator<inproc_transport> comm(std::move(t));
    tp::column_parallel_linear<double, communicator<inproc_transport>> fc(comm, 3, 2);
    std::vector<double> w(5), b(2);
    try {
      fc.load(w, b);
    } catch (const dtrain::error&) {
      refused = true;
    }
  });
  CHECK(refused);
}

TEST_CASE("tensor parallel: ranks that build layers of different shapes are refused at construction, on every rank",
          "[tensor_parallel]") {
  // One rank is given a hidden size of 14 where the others have 12 (or another input size): no
  // allreduce's length depends on it, so without the check the block would train on, wrong.
  for (const bool column : {true, false}) {
    for (const int odd : {1, 2}) {          // the rank built differently
      for (const bool split_dim : {true, false}) {  // the split dimension differs, or the other one
        INFO((column ? "column" : "row") << ", rank " << odd << (split_dim ? ", split" : ", whole") << " dimension");
        std::vector<std::string> errors(3);
        run_inproc(3, [&](int r, inproc_transport t) {
          communicator<inproc_transport> comm(std::move(t));
          const std::size_t hidden = r == odd && split_dim ? 14 : 12, other = r == odd && !split_dim ? 5 : 4;
          try {
            if (column) {
              tp::column_parallel_linear<double, communicator<inproc_transport>> fc(comm, other, hidden);
            } else {
              tp::row_parallel_linear<double, communicator<inproc_transport>> fc(comm, hidden, other);
            }
          } catch (const dtrain::error& e) {
            if (e.code() == errc::invalid_argument) errors[static_cast<std::size_t>(r)] = e.what();
          }
        });
        const std::string theirs = split_dim ? "14" : "12", odd_other = split_dim ? "4" : "5";
        const std::string want = "rank 0 builds " + std::string(column ? "4 -> 12" : "12 -> 4") + ", rank " +
                                 std::to_string(odd) + " builds " +
                                 (column ? odd_other + " -> " + theirs : theirs + " -> " + odd_other);
        for (const std::string& e : errors) {
          INFO(e);
          CHECK(e.find(column ? "column_parallel_linear" : "row_parallel_linear") != std::string::npos);
          CHECK(e.find(want) != std::string::npos);
        }
      }
    }
  }
}
