// Conformance: every collective, every algorithm that implements it, world sizes 1..9, element
// counts 0, 1, 7, 1000 (never divisible by 3, 6, 7 or 9) and about 1<<20, every element type and
// reduction op (sum, avg and max on the large count), in place and out of place, against the
// serial reference of conformance_case.hpp.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "../catch.hpp"
#include "dtrain/transport/inproc.hpp"
#include "dtrain/collective/communicator.hpp"
#include "conformance_case.hpp"
#include "float_case.hpp"
#include "../support/thread_checks.hpp"

using namespace dtrain;
using namespace dtrain::conformance;

namespace {

constexpr int max_world = 9;

template <class T>
void run_case(const spec& s) {
  const std::vector<T> expect = expected_results<T>(s);
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

  run_inproc(s.p, [&](int r, inproc_transport t) {
    communicator_options o;
    o.algorithms.force(s.op, s.algo);
    o.timeout = std::chrono::seconds(120);
    o.segment_bytes = s.n == 1000 ? 64 : 64 * 1024;  // many segments, some of them empty
    communicator<inproc_transport> c(std::move(t), o);
    run_rank<T>(s, r, c, expect, check);
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
      std::vector<std::size_t> counts{
          0, 1, 7, 1000,
          blocks ? (std::size_t{1} << 20) / static_cast<std::size_t>(p) + 1 : (std::size_t{1} << 20) + 3};
      for (std::size_t n : counts) {
        const bool large = n > 1000;
        std::vector<int> roots = is_rooted(op) ? (large ? std::vector<int>{p / 2} : std::vector<int>{0, p - 1})
                                               : std::vector<int>{0};
        if (roots.size() == 2 && roots[0] == roots[1]) roots.pop_back();
        // Every operator on the small counts: each algorithm's combining is the same code for all
        // of them, so these show they are wired through. The large count, where an algorithm cuts
        // its buffer into segments and into the transport's pieces (halving-doubling's exchanges:
        // a path no small count takes), takes sum, avg (divided at the end) and, on float, max
        // (an operator that combines otherwise); tests/reduce/host.cpp checks every operator's
        // kernel at 65537 elements.
        std::vector<reduce_op> ops{reduce_op::sum};
        if (reducing) ops.insert(ops.end(), {reduce_op::avg, reduce_op::max});
        if (reducing && !large) {
          ops.insert(ops.end(), {reduce_op::prod, reduce_op::min, reduce_op::band, reduce_op::bor, reduce_op::bxor});
        }
        // Large: out of place on 2, 3, 6 and 7 ranks (a power of two among them: halving-doubling
        // then sends its first step straight from `in`), in place on the others.
        std::vector<bool> places = has_in_place
                                       ? (large ? std::vector<bool>{(p / 2) % 2 == 0} : std::vector<bool>{false, true})
                                       : std::vector<bool>{false};
        for (int root : roots) {
          for (reduce_op rop : ops) {
            for (bool in_place : places) {
              spec s{op, a, p, n, rop, root, in_place};
              for_each_type([&]<class T>() {
                if (is_bitwise(rop) && !bitwise_reducible_v<T>) return;
                if (large && rop == reduce_op::max && !std::is_same_v<T, float>) return;
                run_case<T>(s);
                ++cases;
              });
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
  for (algorithm a : {algorithm::dissemination, algorithm::binomial_tree}) {
    for (int p = 1; p <= max_world; ++p) {
      std::atomic<int> arrived{0};
      std::atomic<int> early{0};
      run_inproc(p, [&](int r, inproc_transport t) {
        communicator<inproc_transport> c(std::move(t));
        c.algorithms().force(coll_op::barrier, a);
        for (int round = 0; round < 20; ++round) {
          std::this_thread::sleep_for(std::chrono::microseconds((r * 37 + round * 11) % 300));
          arrived.fetch_add(1);
          c.barrier();
          if (arrived.load() < (round + 1) * p) early.fetch_add(1);
          c.barrier();  // nobody starts the next round before all checked this one
        }
      });
      INFO(algorithm_name(a) << ", p=" << p);
      REQUIRE(early.load() == 0);
    }
  }
}

TEST_CASE("conformance: the automatic choice runs every collective correctly", "[collective][conformance]") {
  // Sizes on both sides of the cost model's crossovers, with whatever it picks.
  for (int p : {2, 5, 8}) {
    for (std::size_t n : {std::size_t{3}, std::size_t{5000}, std::size_t{300000}}) {
      run_inproc(p, [&](int r, inproc_transport t) {
        communicator<inproc_transport> c(std::move(t));
        std::vector<double> v(n), ref(n);
        for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<double>((r + 1) * (i % 13));
        for (std::size_t i = 0; i < n; ++i) ref[i] = static_cast<double>(p * (p + 1) / 2 * (i % 13));
        c.allreduce(std::span(v), reduce_op::sum);
        if (v != ref) TFAIL("allreduce p=" << p << " n=" << n);
        std::vector<double> all(n * static_cast<std::size_t>(p));
        c.allgather<double>(std::span(v).first(n), std::span(all));
        for (int b = 0; b < p; ++b) {
          if (!std::equal(ref.begin(), ref.end(),
                          all.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(b) * n)))
            TFAIL("allgather");
        }
        std::vector<double> bc(n, r == p - 1 ? 1.5 : 0.0);
        c.broadcast(std::span(bc), p - 1);
        if (!std::all_of(bc.begin(), bc.end(), [](double x) { return x == 1.5; })) TFAIL("broadcast");
      });
    }
  }
}

// Small integers sum exactly in any order; random floats do not (float_case.hpp): every reducing
// collective, algorithm and form, within the summation bound of a long double reference, exactly
// one binary tree's sum on up to 4 ranks, and allreduce's result the same bits on every rank.
TEST_CASE("conformance: random floats reduce within the summation bound, the same bits on every rank",
          "[collective][conformance]") {
  std::atomic<long> cases{0};
  for (coll_op op : {coll_op::reduce, coll_op::allreduce, coll_op::reduce_scatter, coll_op::reduce_scatterv}) {
    for (algorithm a : all_algorithms) {
      if (!supports(op, a)) continue;
      for (int p : {1, 2, 3, 4, 5, 7, 8}) {
        std::atomic<int> wrong{0};
        std::mutex m;
        std::string first;
        run_inproc(p, [&](int r, inproc_transport t) {
          communicator_options o;
          o.algorithms.force(op, a);
          o.timeout = std::chrono::seconds(60);
          o.segment_bytes = 256;  // n = 1000 crosses many segments
          communicator<inproc_transport> c(std::move(t), o);
          std::string mine;
          int bad = 0;
          for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}}) {
            for (reduce_op rop : {reduce_op::sum, reduce_op::avg}) {
              for (int form = 0; form < (n == 1000 ? 3 : 2); ++form) {  // out of place, in place, nonblocking
                const float_case::spec s{op, a, p, n, rop, static_cast<int>(n) % p, form == 1, form == 2,
                                         n * 131 + static_cast<std::size_t>(p)};
                bad += float_case::run_rank<float>(s, r, c, c, mine) + float_case::run_rank<double>(s, r, c, c, mine);
                if (r == 0) cases += 2;
              }
            }
          }
          wrong += bad;
          std::lock_guard lock(m);
          if (first.empty()) first = mine;
        });
        INFO(first);
        REQUIRE(wrong.load() == 0);
      }
    }
  }
  INFO(cases.load() << " cases");
  CHECK(cases.load() > 500);
}
