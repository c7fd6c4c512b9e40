#pragma once
// One conformance case, shared by the in-process suite and the TCP worker processes: the inputs,
// the serial reference, and what one rank does and checks.
//
// Inputs are small integers, so every result is exact in every type (float16 and bfloat16
// included) and must match the reference bit for bit, whatever order an algorithm combines in.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "dtrain/collective/communicator.hpp"

namespace dtrain::conformance {

inline int input_value(coll_op op, reduce_op rop, int r, std::size_t i) {
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
      case reduce_op::band: acc &= v; break;
      case reduce_op::bor: acc |= v; break;
      case reduce_op::bxor: acc ^= v; break;
      case reduce_op::custom: break;  // user operators: api_case.hpp
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

inline std::string describe_case(const spec& s, dtype t) {
  return std::string(coll_op_name(s.op)) + "/" + std::string(algorithm_name(s.algo)) +
         " p=" + std::to_string(s.p) + " n=" + std::to_string(s.n) + " " +
         std::string(dtype_name(t)) + " " + std::string(reduce_op_name(s.rop)) +
         " root=" + std::to_string(s.root) + (s.in_place ? " in-place" : " out-of-place");
}

/// The results the reducing collectives must produce, computed serially before any rank runs.
template <class T>
std::vector<T> expected_results(const spec& s) {
  const int p = s.p;
  const std::size_t n = s.n;
  const auto P = static_cast<std::size_t>(p);
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

  return expect;
}

/// What rank `r` does in case `s` on communicator `c`; `check(r, got, want)` judges each result.
template <class T, class Comm, class Check>
void run_rank(const spec& s, int r, Comm& c, const std::vector<T>& expect, Check&& check) {
  const std::size_t n = s.n;
  const auto P = static_cast<std::size_t>(s.p);
  const T garbage = make<T>(77);
  auto in_val = [&](int rr, std::size_t i) { return make<T>(input_value(s.op, s.rop, rr, i)); };
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
        c.template reduce<T>(in, std::span(out), s.rop, s.root);
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
        c.template allreduce<T>(in, std::span(out), s.rop);
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
        c.template reduce_scatter<T>(in, std::span(out), s.rop);
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
        c.template allgather<T>(in, std::span(out));
      }
      check(r, out, [&](std::size_t i) {
        return in_val(static_cast<int>(i / std::max<std::size_t>(n, 1)), i % std::max<std::size_t>(n, 1));
      });
      break;
    }
    case coll_op::gather: {
      std::vector<T> in(n), out(r == s.root ? P * n : 0, garbage);
      for (std::size_t i = 0; i < n; ++i) in[i] = in_val(r, i);
      c.template gather<T>(in, std::span(out), s.root);
      if (r == s.root) {
        check(r, out, [&](std::size_t i) { return in_val(static_cast<int>(i / n), i % n); });
      }
      break;
    }
    case coll_op::scatter: {
      std::vector<T> in(r == s.root ? P * n : 0), out(n, garbage);
      for (std::size_t i = 0; i < in.size(); ++i) in[i] = in_val(s.root, i);
      c.template scatter<T>(in, std::span(out), s.root);
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
        c.template alltoall<T>(in, std::span(out));
        check(r, out, want);
      }
      break;
    }
    default: break;
  }
}

}  // namespace dtrain::conformance
