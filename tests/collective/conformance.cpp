// Conformance: every collective, every algorithm that implements it, world sizes 1..9, element
// counts 0, 1, 7, 1000 (never divisible by 3, 6, 7 or 9) and about 1<<20, every element type and
// reduction op, in place and out of place, against a serial reference computed here.
//
// Inputs are small integers, so every result is exact in every type (float16 and bfloat16
// included) and must match the reference bit for bit, whatever order an algorithm combines in.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../catch.hpp"
#include "dtrain/transport/inproc.hpp"
#include "dtrain/collective/communicator.hpp"

using namespace dtrain;

namespace {

constexpr int max_world = 9;

int input_value(coll_op op, reduce_op rop, int r, std::size_t i) {
  auto ri = static_cast<std::size_t>(r);
  if (takes_reduce_op(op)) {
    switch (rop) {
      case reduce_op::sum:
      case reduce_op::avg: return static_cast<int>((ri * 31 + i * 17) % 9) - 4;
      case reduce_op::prod:
        if ((ri + i) % 5 == 0) return 2;  // at most 2^9 in magnitude: exact in bfloat16
        return (ri * 3 + i) % 7 == 0 ? -1 : 1;
      default: return static_cast<int>((ri * 131 + i * 71) % 201) - 100;
    }
  }
  return static_cast<int>((ri * 37 + i * 11) % 251) - 125;
}

template <class T>
T make(std::int64_t v) {
  return static_cast<T>(static_cast<compute_type_t<T>>(v));
}

// The reduction over ranks 0..p-1 of input_value(·, i), computed in 64-bit integers.
template <class T>
T reference_reduce(coll_op op, reduce_op rop, int p, std::size_t i) {
  std::int64_t acc = input_value(op, rop, 0, i);
  for (int r = 1; r < p; ++r) {
    std::int64_t v = input_value(op, rop, r, i);
    switch (rop) {
      case reduce_op::sum:
      case reduce_op::avg: acc += v; break;
      case reduce_op::prod: acc *= v; break;
      case reduce_op::min: acc = std::min(acc, v); break;
      case reduce_op::max: acc = std::max(acc, v); break;
    }
  }
  T t = make<T>(acc);
  if (rop == reduce_op::avg) {
    using C = compute_type_t<T>;
    t = static_cast<T>(static_cast<C>(static_cast<C>(t) / static_cast<C>(p)));
  }
  return t;
}

struct spec {
  coll_op op;
  algorithm algo;
  int p;
  std::size_t n;  // the count the caller passes (per-rank block for block collectives)
  reduce_op rop;
  int root;
  bool in_place;
};

std::string describe_case(const spec& s, dtype t) {
  return std::string(coll_op_name(s.op)) + "/" + std::string(algorithm_name(s.algo)) +
         " p=" + std::to_string(s.p) + " n=" + std::to_string(s.n) + " " +
         std::string(dtype_name(t)) + " " + std::string(reduce_op_name(s.rop)) +
         " root=" + std::to_string(s.root) + (s.in_place ? " in-place" : " out-of-place");
}

template <class T>
void run_case(const spec& s) {
  const int p = s.p;
  const std::size_t n = s.n;
  const auto P = static_cast<std::size_t>(p);
  const T garbage = make<T>(77);
  auto in_val = [&](int r, std::size_t i) { return make<T>(input_value(s.op, s.rop, r, i)); };

  // Expected results, computed once, serially, before any rank runs.
  std::vector<T> expect;
  switch (s.op) {
    case coll_op::allreduce:
    case coll_op::reduce:
      expect.resize(n);
      for (std::size_t i = 0; i < n; ++i) expect[i] = reference_reduce<T>(s.op, s.rop, p, i);
      break;
    case coll_op::reduce_scatter:
      expect.resize(P * n);  // the result every rank r must get is expect[r*n .. r*n+n)
      for (std::size_t i = 0; i < P * n; ++i) expect[i] = reference_reduce<T>(s.op, s.rop, p, i);
      break;
    default: break;
  }

  std::atomic<int> wrong{0};
  std::atomic<long> first_bad{-1};
  auto check = [&](int r, std::span<const T> got, const std::function<T(std::size_t)>& want) {
    for (std::size_t i = 0; i < got.size(); ++i) {
      if (!(got[i] == want(i))) {
        ++wrong;
        long expected = -1;
        first_bad.compare_exchange_strong(expected, static_cast<long>(r) * 1'000'000'000L +
                                                        static_cast<long>(i));
        return;
      }
    }
  };

  run_inproc(p, [&](int r, inproc_transport t) {
    communicator_options o;
    o.algorithms.force(s.op, s.algo);
    o.timeout = std::chrono::seconds(120);
    o.segment_bytes = n == 1000 ? 64 : 64 * 1024;  // many segments, some of them empty
    communicator<inproc_transport> c(std::move(t), o);
    switch (s.op) {
      case coll_op::broadcast: {
        std::vector<T> buf(n, garbage);
        if (r == s.root) for (std::size_t i = 0; i < n; ++i) buf[i] = in_val(s.root, i);
        c.broadcast(std::span(buf), s.root);
        check(r, buf, [&](std::size_t i) { return in_val(s.root, i); });
        break;
      }
      case coll_op::reduce: {
        std::vector<T> in(n), out(n, garbage);
        for (std::size_t i = 0; i < n; ++i) in[i] = in_val(r, i);
        if (s.in_place) {
          c.reduce(std::span(in), s.rop, s.root);
          if (r == s.root) {
            check(r, in, [&](std::size_t i) { return expect[i]; });
          } else {
            check(r, in, [&](std::size_t i) { return in_val(r, i); });  // left unchanged
          }
        } else {
          c.reduce<T>(in, std::span(out), s.rop, s.root);
          if (r == s.root) {
            check(r, out, [&](std::size_t i) { return expect[i]; });
          } else {
            check(r, out, [&](std::size_t) { return garbage; });
          }
        }
        break;
      }
      case coll_op::allreduce: {
        std::vector<T> in(n), out(n, garbage);
        for (std::size_t i = 0; i < n; ++i) in[i] = in_val(r, i);
        if (s.in_place) {
          c.allreduce(std::span(in), s.rop);
          check(r, in, [&](std::size_t i) { return expect[i]; });
        } else {
          c.allreduce<T>(in, std::span(out), s.rop);
          check(r, out, [&](std::size_t i) { return expect[i]; });
        }
        break;
      }
      case coll_op::reduce_scatter: {
        std::vector<T> in(P * n), out(n, garbage);
        for (std::size_t i = 0; i < P * n; ++i) in[i] = in_val(r, i);
        auto mine = [&](std::size_t j) { return expect[static_cast<std::size_t>(r) * n + j]; };
        if (s.in_place) {
          c.reduce_scatter(std::span(in), s.rop);
          check(r, std::span<const T>(in).subspan(static_cast<std::size_t>(r) * n, n), mine);
        } else {
          c.reduce_scatter<T>(in, std::span(out), s.rop);
          check(r, out, mine);
        }
        break;
      }
      case coll_op::allgather: {
        std::vector<T> in(n), out(P * n, garbage);
        for (std::size_t i = 0; i < n; ++i) in[i] = in_val(r, i);
        if (s.in_place) {
          std::copy(in.begin(), in.end(), out.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * n));
          c.allgather(std::span(out));
        } else {
          c.allgather<T>(in, std::span(out));
        }
        check(r, out, [&](std::size_t i) { return in_val(static_cast<int>(i / std::max<std::size_t>(n, 1)), i % std::max<std::size_t>(n, 1)); });
        break;
      }
      case coll_op::gather: {
        std::vector<T> in(n), out(r == s.root ? P * n : 0, garbage);
        for (std::size_t i = 0; i < n; ++i) in[i] = in_val(r, i);
        c.gather<T>(in, std::span(out), s.root);
        if (r == s.root) {
          check(r, out, [&](std::size_t i) { return in_val(static_cast<int>(i / n), i % n); });
        }
        break;
      }
      case coll_op::scatter: {
        std::vector<T> in(r == s.root ? P * n : 0), out(n, garbage);
        for (std::size_t i = 0; i < in.size(); ++i) in[i] = in_val(s.root, i);
        c.scatter<T>(in, std::span(out), s.root);
        check(r, out, [&](std::size_t j) { return in_val(s.root, static_cast<std::size_t>(r) * n + j); });
        break;
      }
      case coll_op::alltoall: {
        std::vector<T> in(P * n), out(P * n, garbage);
        for (std::size_t i = 0; i < P * n; ++i) in[i] = in_val(r, i);
        auto want = [&](std::size_t i) {
          std::size_t b = i / n, j = i % n;
          return in_val(static_cast<int>(b), static_cast<std::size_t>(r) * n + j);
        };
        if (s.in_place) {
          c.alltoall(std::span(in));
          check(r, in, want);
        } else {
          c.alltoall<T>(in, std::span(out));
          check(r, out, want);
        }
        break;
      }
      default: break;
    }
  });
  INFO(describe_case(s, dtype_of_v<T>) << ", first wrong element (rank * 1e9 + index): "
                                       << first_bad.load());
  REQUIRE(wrong.load() == 0);
}

template <class F>
void for_each_type(F&& f) {
  f.template operator()<float>();
  f.template operator()<double>();
  f.template operator()<std::int32_t>();
  f.template operator()<std::int64_t>();
  f.template operator()<float16>();
  f.template operator()<bfloat16>();
}

void run_matrix(coll_op op) {
  const bool reducing = takes_reduce_op(op);
  const bool blocks = op == coll_op::reduce_scatter || op == coll_op::allgather ||
                      op == coll_op::gather || op == coll_op::scatter || op == coll_op::alltoall;
  const bool has_in_place = op != coll_op::broadcast && op != coll_op::gather && op != coll_op::scatter;
  int cases = 0;
  for (algorithm a : all_algorithms) {
    if (!supports(op, a)) continue;
    for (int p = 1; p <= max_world; ++p) {
      // Block collectives take a per-rank count; the large case keeps the total near 1<<20.
      std::vector<std::size_t> counts{0, 1, 7, 1000, blocks ? (std::size_t{1} << 20) / static_cast<std::size_t>(p) + 1 : (std::size_t{1} << 20) + 3};
      for (std::size_t n : counts) {
        const bool large = n > 1000;
        std::vector<int> roots = is_rooted(op) ? (large ? std::vector<int>{p / 2} : std::vector<int>{0, p - 1})
                                               : std::vector<int>{0};
        if (roots.size() == 2 && roots[0] == roots[1]) roots.pop_back();
        std::vector<reduce_op> ops = reducing ? std::vector<reduce_op>{reduce_op::sum, reduce_op::prod, reduce_op::min, reduce_op::max, reduce_op::avg}
                                              : std::vector<reduce_op>{reduce_op::sum};
        std::vector<bool> places = has_in_place ? (large ? std::vector<bool>{p % 2 == 0} : std::vector<bool>{false, true})
                                                : std::vector<bool>{false};
        for (int root : roots) {
          for (reduce_op rop : ops) {
            for (bool in_place : places) {
              spec s{op, a, p, n, rop, root, in_place};
              for_each_type([&]<class T>() { run_case<T>(s); });
              cases += 6;
            }
          }
        }
      }
    }
  }
  INFO(cases << " cases");
  CHECK(cases > 0);
}

}  // namespace

TEST_CASE("conformance: broadcast", "[collective][conformance]") { run_matrix(coll_op::broadcast); }
TEST_CASE("conformance: reduce", "[collective][conformance]") { run_matrix(coll_op::reduce); }
TEST_CASE("conformance: allreduce", "[collective][conformance]") { run_matrix(coll_op::allreduce); }
TEST_CASE("conformance: reduce_scatter", "[collective][conformance]") { run_matrix(coll_op::reduce_scatter); }
TEST_CASE("conformance: allgather", "[collective][conformance]") { run_matrix(coll_op::allgather); }
TEST_CASE("conformance: gather", "[collective][conformance]") { run_matrix(coll_op::gather); }
TEST_CASE("conformance: scatter", "[collective][conformance]") { run_matrix(coll_op::scatter); }
TEST_CASE("conformance: alltoall", "[collective][conformance]") { run_matrix(coll_op::alltoall); }

TEST_CASE("conformance: barrier lets nobody out before everyone is in", "[collective][conformance]") {
  for (int p = 1; p <= max_world; ++p) {
    std::atomic<int> arrived{0};
    std::atomic<int> early{0};
    run_inproc(p, [&](int r, inproc_transport t) {
      communicator<inproc_transport> c(std::move(t));
      for (int round = 0; round < 20; ++round) {
        std::this_thread::sleep_for(std::chrono::microseconds((r * 37 + round * 11) % 300));
        arrived.fetch_add(1);
        c.barrier();
        if (arrived.load() < (round + 1) * p) early.fetch_add(1);
        c.barrier();  // nobody starts the next round before all checked this one
      }
    });
    INFO("p=" << p);
    REQUIRE(early.load() == 0);
  }
}

TEST_CASE("conformance: the automatic choice runs every collective correctly", "[collective][conformance]") {
  // Sizes on both sides of the cost model's crossovers, with whatever it picks.
  for (int p : {2, 5, 8}) {
    for (std::size_t n : {std::size_t{3}, std::size_t{5000}, std::size_t{300000}}) {
      run_inproc(p, [&](int r, inproc_transport t) {
        tuned<inproc_transport> c(std::move(t));
        std::vector<double> v(n), ref(n);
        for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<double>((r + 1) * (i % 13));
        for (std::size_t i = 0; i < n; ++i) ref[i] = static_cast<double>(p * (p + 1) / 2 * (i % 13));
        c.allreduce(std::span(v), reduce_op::sum);
        if (v != ref) FAIL("allreduce p=" << p << " n=" << n);
        std::vector<double> all(n * static_cast<std::size_t>(p));
        c.allgather<double>(std::span(v).first(n), std::span(all));
        for (int b = 0; b < p; ++b) {
          if (!std::equal(ref.begin(), ref.end(), all.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(b) * n))) FAIL("allgather");
        }
        std::vector<double> bc(n, r == p - 1 ? 1.5 : 0.0);
        c.broadcast(std::span(bc), p - 1);
        if (!std::all_of(bc.begin(), bc.end(), [](double x) { return x == 1.5; })) FAIL("broadcast");
      });
    }
  }
}
