#pragma once
// Random floating-point inputs for the reducing collectives, shared by the in-process suites and
// tcp_worker. Small integers sum exactly in any order; these do not, so each result is held to:
//  1. the same bits on every rank (allreduce: a digest of each rank's result, allgathered);
//  2. |got - s| <= (P-1) u sum_i |x_i|, s the long double sum, u = eps/2 of T: the error bound of
//     summation in ANY order of additions (Jeannerod & Rump, SIMAX 34(2), 2013), plus the
//     reference's own error; avg adds one rounding for its division;
//  3. on P <= 4 ranks, exactly the sum of one binary tree of additions in T (at most 15 such).

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "dtrain/collective/communicator.hpp"
#include "dtrain/core/hash.hpp"

namespace dtrain::float_case {

// Rank r's element i: random sign, significand and exponent in [-e, e] (e = 20 for float, 60 for
// double), a pure function of (seed, r, i) so that every process can compute the reference. At
// every eighth index an odd rank cancels the rank before it: catastrophic cancellation.
template <class T>
T input(std::uint64_t seed, int r, std::size_t i) {
  if (i % 8 == 7 && r % 2 == 1) return static_cast<T>(-input<T>(seed, r - 1, i));
  const std::uint64_t a = splitmix64(splitmix64(seed * 1000003u + static_cast<std::uint64_t>(r)) ^ i);
  const std::uint64_t b = splitmix64(a), c = splitmix64(b);
  const int e = std::is_same_v<T, float> ? 20 : 60;
  const double x = std::ldexp(1.0 + static_cast<double>(a >> 11) * 0x1p-53, static_cast<int>(b % (2 * e + 1)) - e);
  return static_cast<T>(c & 1 ? -x : x);
}

struct reference { long double sum = 0, abs = 0; };

template <class T>
reference reference_at(std::uint64_t seed, int p, std::size_t i) {
  reference w;
  for (int r = 0; r < p; ++r) {
    const auto x = static_cast<long double>(input<T>(seed, r, i));
    w.sum += x;
    w.abs += std::fabs(x);
  }
  return w;
}

// Whether some binary tree of additions in T over x[0..p) (p <= 4) gives `got` (`avg`: divided).
template <class T>
bool some_tree_gives(T got, const T* x, int p, reduce_op op) {
  std::array<std::array<T, 15>, 16> v{};  // by set of ranks: each tree's sum (15 trees over 4)
  std::array<int, 16> k{};
  for (unsigned m = 1; m < (1u << p); ++m) {
    if (std::has_single_bit(m)) {
      v[m][k[m]++] = x[std::countr_zero(m)];
      continue;
    }
    const unsigned low = m & (~m + 1);
    for (unsigned a = (m - 1) & m; a != 0; a = (a - 1) & m) {
      if ((a & low) == 0) continue;  // each split once: by the part holding the lowest rank
      for (int i = 0; i < k[a]; ++i) {
        for (int j = 0; j < k[m ^ a]; ++j) v[m][k[m]++] = static_cast<T>(v[a][i] + v[m ^ a][j]);
      }
    }
  }
  const unsigned all = (1u << p) - 1;
  for (int i = 0; i < k[all]; ++i) {
    const T s = op == reduce_op::avg ? static_cast<T>(v[all][i] / static_cast<T>(p)) : v[all][i];
    if (std::memcmp(&s, &got, sizeof(T)) == 0) return true;  // the same bits
  }
  return false;
}

// Whether `got` may be the reduction at input index i over p ranks.
template <class T>
bool acceptable(T got, std::uint64_t seed, int p, std::size_t i, reduce_op op) {
  const reference w = reference_at<T>(seed, p, i);
  const long double u = std::numeric_limits<T>::epsilon() / 2;
  const long double u_ref = std::numeric_limits<long double>::epsilon() / 2;
  long double bound = (p - 1) * (u + u_ref) * w.abs, want = w.sum;
  if (op == reduce_op::avg) {
    want /= p;
    bound = bound / p + u * (std::fabs(want) + bound / p);
  }
  if (!std::isfinite(got) || std::fabs(static_cast<long double>(got) - want) > bound * (1 + 16 * u_ref)) return false;
  if (p > 4) return true;
  std::array<T, 4> x{};
  for (int r = 0; r < p; ++r) x[static_cast<std::size_t>(r)] = input<T>(seed, r, i);
  return some_tree_gives(got, x.data(), p, op);
}

struct spec {
  coll_op op;      // reduce, allreduce, reduce_scatter or reduce_scatterv
  algorithm algo;  // set on the communicator by the caller; named in reports
  int p;
  std::size_t n;   // per-rank block for reduce_scatter(v)
  reduce_op rop;   // sum or avg
  int root;
  bool in_place, nonblocking;
  std::uint64_t seed;
};

inline std::string describe(const spec& s, dtype t) {
  return "random " + std::string(dtype_name(t)) + " " + std::string(coll_op_name(s.op)) + "/" +
         std::string(algorithm_name(s.algo)) + " p=" + std::to_string(s.p) + " n=" + std::to_string(s.n) + " " +
         std::string(reduce_op_name(s.rop)) + (s.in_place ? " in-place" : " out-of-place") +
         (s.nonblocking ? " nonblocking" : "") + " seed=" + std::to_string(s.seed);
}

// reduce_scatterv's counts: rank q's block is empty when q % 3 == 1, else n + q elements.
inline std::vector<std::size_t> v_counts(int p, std::size_t n) {
  std::vector<std::size_t> c;
  for (int q = 0; q < p; ++q) c.push_back(q % 3 == 1 ? 0 : n + static_cast<std::size_t>(q));
  return c;
}

// What rank r does in case s on `c` (set to s.algo by the caller; a hierarchical_communicator
// runs allreduce only); `flat` (the same ranks, any communicator) allgathers the digests of the
// allreduce results. @returns this rank's wrong results, the first described in `first`.
template <class T, class Comm, class Flat>
int run_rank(const spec& s, int r, Comm& c, Flat& flat, std::string& first) {
  const auto P = static_cast<std::size_t>(s.p), R = static_cast<std::size_t>(r);
  int wrong = 0;
  auto bad = [&](const std::string& what) {
    if (wrong++ == 0) first = describe(s, dtype_of_v<T>) + ": rank " + std::to_string(r) + " " + what;
  };
  // Checks got[j] as the reduction at input index at + j.
  auto judge = [&](std::span<const T> got, std::size_t at) {
    for (std::size_t j = 0; j < got.size(); ++j) {
      if (!acceptable<T>(got[j], s.seed, s.p, at + j, s.rop)) return bad("element " + std::to_string(j));
    }
  };
  std::vector<std::size_t> counts =
      s.op == coll_op::reduce_scatterv ? v_counts(s.p, s.n) : std::vector<std::size_t>(P, s.n);
  std::size_t total = 0, mine_at = 0;
  for (std::size_t q = 0; q < P; ++q) (q < R ? mine_at : total) += counts[q];
  total += mine_at;
  const std::size_t in_n = s.op == coll_op::allreduce || s.op == coll_op::reduce ? s.n : total;
  const std::size_t out_n = s.op == coll_op::allreduce || s.op == coll_op::reduce ? s.n : counts[R];
  std::vector<T> in(in_n), out(out_n, T(77));
  for (std::size_t i = 0; i < in_n; ++i) in[i] = input<T>(s.seed, r, i);
  const std::vector<T> original = in;
  std::span<const T> cin(in);
  constexpr bool flat_api = requires(Comm& k, std::span<T> b) { k.template ireduce<T>(b, b, reduce_op::sum, 0); };
  const bool nb = s.nonblocking;
  if constexpr (flat_api) {
    switch (s.op) {  // nonblocking forms run out of place
      case coll_op::allreduce:
        if (nb) c.template iallreduce<T>(cin, std::span(out), s.rop).wait();
        else if (s.in_place) c.template allreduce<T>(std::span(in), s.rop);
        else c.template allreduce<T>(cin, std::span(out), s.rop);
        break;
      case coll_op::reduce:
        if (nb) c.template ireduce<T>(cin, std::span(out), s.rop, s.root).wait();
        else if (s.in_place) c.template reduce<T>(std::span(in), s.rop, s.root);
        else c.template reduce<T>(cin, std::span(out), s.rop, s.root);
        break;
      case coll_op::reduce_scatter:
        if (nb) c.template ireduce_scatter<T>(cin, std::span(out), s.rop).wait();
        else if (s.in_place) c.template reduce_scatter<T>(std::span(in), s.rop);
        else c.template reduce_scatter<T>(cin, std::span(out), s.rop);
        break;
      default:  // reduce_scatterv: out of place only
        if (nb) c.template ireduce_scatterv<T>(cin, counts, std::span(out), s.rop).wait();
        else c.template reduce_scatterv<T>(cin, counts, std::span(out), s.rop);
    }
  } else if (s.in_place) {  // hierarchical_communicator: allreduce only
    c.template allreduce<T>(std::span(in), s.rop);
  } else {
    c.template allreduce<T>(cin, std::span(out), s.rop);
  }
  const bool in_place = s.in_place && !nb && s.op != coll_op::reduce_scatterv;
  std::span<const T> got = in_place ? std::span<const T>(in) : std::span<const T>(out);
  switch (s.op) {
    case coll_op::allreduce: judge(got, 0); break;
    case coll_op::reduce:
      if (r == s.root) judge(got, 0);
      else if (in_place ? in != original : std::any_of(out.begin(), out.end(), [](T x) { return x != T(77); }))
        bad("non-root buffer changed");
      break;
    default: judge(in_place ? got.subspan(mine_at, counts[R]) : got, mine_at);
  }
  if (s.op == coll_op::allreduce) {  // the same bits on every rank
    const auto digest = std::bit_cast<std::int64_t>(fnv1a{}.bytes(std::as_bytes(got)).value());
    std::vector<std::int64_t> all(P);
    flat.template allgather<std::int64_t>(std::span<const std::int64_t>(&digest, 1), std::span(all));
    if (digest != all[0]) bad("holds other bits than rank 0");
  }
  return wrong;
}

}  // namespace dtrain::float_case
