#pragma once
// The collective API beyond the even, blocking forms, as one rank runs it: uneven (`v`) blocks,
// 8-bit, bool and byte elements, users' operators, nonblocking calls waited in any order and
// calls from several threads. Shared by the in-process suite (api.cpp) and the TCP worker
// (tcp_worker api), so both transports run the same checks against the same serial references.
// Each function returns the number of wrong results on this rank.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <atomic>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/collective/communicator.hpp"

namespace dtrain::api_case {

// What rank r puts at index i: distinct per rank and index, and not symmetric in the two.
inline std::int64_t value(int r, std::size_t i) {
  return static_cast<std::int64_t>((static_cast<std::size_t>(r) * 7919 + i * 104729) % 1000003);
}

template <class T>
T as(std::int64_t v) {
  if constexpr (std::is_same_v<T, bool>) {
    return (v % 3) == 0;
  } else if constexpr (std::is_same_v<T, std::byte>) {
    return static_cast<std::byte>(v & 0xff);
  } else {
    return static_cast<T>(static_cast<compute_type_t<T>>(v % 200 - 100));
  }
}

inline void report(int& wrong, bool ok, const std::string& what) {
  if (ok) return;
  if (wrong++ < 5) std::fprintf(stderr, "WRONG: %s\n", what.c_str());
}

// Counts every rank agrees on, with zeros: drawn from `seed`, the same on every rank.
inline std::vector<std::size_t> random_counts(int p, unsigned seed, std::size_t largest) {
  std::mt19937 gen(seed);
  std::vector<std::size_t> c(static_cast<std::size_t>(p));
  for (auto& x : c) x = gen() % 3 == 0 ? 0 : gen() % (largest + 1);
  return c;
}

// allgatherv, gatherv and scatterv (every root), reduce_scatterv and alltoallv (both
// algorithms) against the packed layout computed here, on counts with zeros.
template <class T, class Comm>
int uneven(Comm& c, unsigned seed, std::size_t largest) {
  const int p = c.size();
  const int r = c.rank();
  int wrong = 0;
  const auto counts = random_counts(p, seed, largest);
  std::vector<std::size_t> offs(counts.size() + 1, 0);
  std::partial_sum(counts.begin(), counts.end(), offs.begin() + 1);
  const auto ri = static_cast<std::size_t>(r);
  std::vector<T> mine(counts[ri]);
  for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = as<T>(value(r, i));
  auto expect_gathered = [&](std::span<const T> got, const char* what) {
    for (int q = 0; q < p; ++q) {
      for (std::size_t i = 0; i < counts[static_cast<std::size_t>(q)]; ++i) {
        report(wrong, got[offs[static_cast<std::size_t>(q)] + i] == as<T>(value(q, i)),
               std::string(what) + " rank " + std::to_string(r) + " block " + std::to_string(q));
      }
    }
  };

  std::vector<T> all(offs.back());
  c.template allgatherv<T>(mine, std::span(all), counts);
  expect_gathered(all, "allgatherv");
  for (int root = 0; root < p; ++root) {
    std::vector<T> at_root(r == root ? offs.back() : 0);
    c.template gatherv<T>(mine, std::span(at_root), counts, root);
    if (r == root) expect_gathered(at_root, "gatherv");

    std::vector<T> source(r == root ? offs.back() : 0);
    for (int q = 0; q < p && r == root; ++q) {
      for (std::size_t i = 0; i < counts[static_cast<std::size_t>(q)]; ++i)
        source[offs[static_cast<std::size_t>(q)] + i] = as<T>(value(q, i));
    }
    std::vector<T> got(counts[ri]);
    c.template scatterv<T>(source, counts, std::span(got), root);
    report(wrong, got == mine, "scatterv rank " + std::to_string(r) + " root " + std::to_string(root));
  }

  // reduce_scatterv: block q of every rank's `in` reduces into rank q's `out`.
  if constexpr (reducible_v<T>) {
    std::vector<T> whole(offs.back());
    for (std::size_t j = 0; j < whole.size(); ++j) whole[j] = as<T>(value(r, j));
    for (reduce_op op : {reduce_op::sum, reduce_op::max}) {
      std::vector<T> got(counts[ri]);
      c.template reduce_scatterv<T>(whole, counts, std::span(got), op);
      for (std::size_t i = 0; i < got.size(); ++i) {
        T want = as<T>(value(0, offs[ri] + i));
        for (int q = 1; q < p; ++q) {
          const T v = as<T>(value(q, offs[ri] + i));
          want = op == reduce_op::sum ? static_cast<T>(want + v) : std::max(want, v);
        }
        report(wrong, got[i] == want,
               "reduce_scatterv " + std::string(reduce_op_name(op)) + " rank " + std::to_string(r) + " index " +
                   std::to_string(i));
      }
    }
  }

  // alltoallv: rank s sends rank d a block of (s * 3 + d * 5 + seed) % 4 elements (some empty).
  auto pair_count = [&](int s, int d) {
    return static_cast<std::size_t>((s * 3 + d * 5 + static_cast<int>(seed)) % 4);
  };
  auto pair_value = [&](int s, int d, std::size_t i) { return as<T>(value(s * 31 + d, i)); };
  std::vector<std::size_t> send_counts(static_cast<std::size_t>(p)), recv_counts(static_cast<std::size_t>(p));
  std::vector<T> in, out;
  for (int d = 0; d < p; ++d) {
    send_counts[static_cast<std::size_t>(d)] = pair_count(r, d);
    recv_counts[static_cast<std::size_t>(d)] = pair_count(d, r);
    for (std::size_t i = 0; i < pair_count(r, d); ++i) in.push_back(pair_value(r, d, i));
  }
  for (algorithm a : {algorithm::pairwise, algorithm::linear}) {
    c.algorithms().force(coll_op::alltoallv, a);
    out.assign(std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t{0}), T{});
    c.template alltoallv<T>(in, send_counts, std::span(out), recv_counts);
    std::size_t at = 0;
    for (int s = 0; s < p; ++s) {
      for (std::size_t i = 0; i < pair_count(s, r); ++i) {
        report(wrong, out[at++] == pair_value(s, r, i), "alltoallv/" + std::string(algorithm_name(a)) + " rank " +
                                                            std::to_string(r) + " from " + std::to_string(s));
      }
    }
  }
  return wrong;
}

// The serial reduction of as<T>(value(q, i)) over ranks q, under `op` as documented: 8-bit
// integers wrap, bool's sum and max are or, prod and min are and, bxor is "differ".
template <class T>
T reference(reduce_op op, int p, std::size_t i) {
  T acc = as<T>(value(0, i));
  for (int q = 1; q < p; ++q) {
    const T v = as<T>(value(q, i));
    if constexpr (std::is_same_v<T, bool>) {
      if (op == reduce_op::bxor) {
        acc = acc != v;
      } else {
        acc = (op == reduce_op::sum || op == reduce_op::max || op == reduce_op::bor) ? (acc || v) : (acc && v);
      }
    } else {
      switch (op) {
        case reduce_op::sum: acc = static_cast<T>(acc + v); break;
        case reduce_op::prod: acc = static_cast<T>(acc * v); break;
        case reduce_op::min: acc = std::min(acc, v); break;
        case reduce_op::band: acc = static_cast<T>(acc & v); break;
        case reduce_op::bor: acc = static_cast<T>(acc | v); break;
        case reduce_op::bxor: acc = static_cast<T>(acc ^ v); break;
        default: acc = std::max(acc, v); break;
      }
    }
  }
  return acc;
}

// Every allreduce algorithm, with every operator but avg (the bitwise ones too), on uint8, int8
// and bool; broadcast and allgather of raw bytes (an object's serialised form).
template <class Comm>
int small_types(Comm& c, std::size_t n) {
  int wrong = 0;
  const int p = c.size();
  const int r = c.rank();
  auto each_type = [&]<class T>(T) {
    for (reduce_op op : {reduce_op::sum, reduce_op::prod, reduce_op::min, reduce_op::max, reduce_op::band,
                         reduce_op::bor, reduce_op::bxor}) {
      for (algorithm a : {algorithm::ring, algorithm::halving_doubling, algorithm::recursive_doubling,
                          algorithm::binomial_tree, algorithm::double_binary_tree}) {
        auto storage = std::make_unique<T[]>(n);  // not std::vector, which packs bools
        std::span<T> buf(storage.get(), n);
        for (std::size_t i = 0; i < n; ++i) buf[i] = as<T>(value(r, i));
        c.template allreduce<T>(buf, op, a);
        for (std::size_t i = 0; i < n; ++i) {
          report(wrong, buf[i] == reference<T>(op, p, i),
                 "allreduce/" + std::string(algorithm_name(a)) + " " + std::string(dtype_name(dtype_of_v<T>)) + " " +
                     std::string(reduce_op_name(op)) + " rank " + std::to_string(r) + " index " + std::to_string(i));
        }
      }
    }
  };
  each_type(std::uint8_t{});
  each_type(std::int8_t{});
  each_type(bool{});

  // An object as bytes: the root's length first, then its bytes.
  const std::string object = "rank " + std::to_string(p - 1) + " says: " + std::string(n % 300, 'x');
  std::vector<std::int64_t> length{r == p - 1 ? static_cast<std::int64_t>(object.size()) : 0};
  c.template broadcast<std::int64_t>(std::span(length), p - 1);
  std::vector<std::byte> bytes(static_cast<std::size_t>(length[0]));
  if (r == p - 1)
    std::transform(object.begin(), object.end(), bytes.begin(), [](char ch) { return static_cast<std::byte>(ch); });
  c.template broadcast<std::byte>(std::span(bytes), p - 1);
  std::string got(bytes.size(), '\0');
  std::transform(bytes.begin(), bytes.end(), got.begin(), [](std::byte b) { return static_cast<char>(b); });
  report(wrong, got == object, "broadcast of bytes on rank " + std::to_string(r));

  std::vector<std::byte> mine(n), all(n * static_cast<std::size_t>(p));
  for (std::size_t i = 0; i < n; ++i) mine[i] = as<std::byte>(value(r, i));
  c.template allgather<std::byte>(mine, std::span(all));
  for (int q = 0; q < p; ++q) {
    for (std::size_t i = 0; i < n; ++i) {
      report(wrong, all[static_cast<std::size_t>(q) * n + i] == as<std::byte>(value(q, i)), "allgather of bytes");
    }
  }
  return wrong;
}

// A user's operator (gcd, which no built-in computes) through allreduce with every algorithm,
// reduce and reduce_scatter, against the serial gcd.
template <class Comm>
int user_operator(Comm& c, std::size_t n) {
  int wrong = 0;
  const int p = c.size();
  const int r = c.rank();
  auto gcd = user_op<std::int64_t>([](std::int64_t a, std::int64_t b) { return std::gcd(a, b); });
  auto mine = [&](int q, std::size_t i) {
    return (value(q, i) % 7 + 1) * (value(q + 1, i) % 5 + 1) * static_cast<std::int64_t>(i % 6 + 1);
  };
  auto expect = [&](std::size_t i) {
    std::int64_t g = mine(0, i);
    for (int q = 1; q < p; ++q) g = std::gcd(g, mine(q, i));
    return g;
  };
  auto fill = [&](std::vector<std::int64_t>& v) {
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = mine(r, i);
  };
  for (algorithm a : {algorithm::ring, algorithm::halving_doubling, algorithm::recursive_doubling,
                      algorithm::binomial_tree, algorithm::double_binary_tree}) {
    std::vector<std::int64_t> buf(n);
    fill(buf);
    c.template allreduce<std::int64_t>(std::span(buf), gcd, a);
    for (std::size_t i = 0; i < n; ++i)
      report(wrong, buf[i] == expect(i), "user op allreduce/" + std::string(algorithm_name(a)));
  }
  std::vector<std::int64_t> in(n), out(n);
  fill(in);
  c.template reduce<std::int64_t>(in, std::span(out), gcd, 0);
  for (std::size_t i = 0; i < n && r == 0; ++i) report(wrong, out[i] == expect(i), "user op reduce");
  std::vector<std::int64_t> blocks(n * static_cast<std::size_t>(p)), mine_block(n);
  fill(blocks);
  c.template reduce_scatter<std::int64_t>(blocks, std::span(mine_block), gcd);
  for (std::size_t i = 0; i < n; ++i)
    report(wrong, mine_block[i] == expect(static_cast<std::size_t>(r) * n + i), "user op reduce_scatter");
  return wrong;
}

// Several nonblocking collectives in flight on one communicator, waited for in an order that
// differs between ranks (and test()-polled), then a blocking call that must queue behind them.
template <class Comm>
int nonblocking(Comm& c, std::size_t n, unsigned seed) {
  int wrong = 0;
  const int p = c.size();
  const int r = c.rank();
  std::vector<float> sum(n), mx(n), bcast(n);
  std::vector<std::int32_t> gathered(n * static_cast<std::size_t>(p)), mine(n);
  for (std::size_t i = 0; i < n; ++i) {
    sum[i] = static_cast<float>(value(r, i) % 64);
    mx[i] = static_cast<float>(value(r, i) % 1000);
    bcast[i] = r == 0 ? static_cast<float>(i) : -1.0f;
    mine[i] = static_cast<std::int32_t>(value(r, i));
  }
  const auto counts = random_counts(p, seed, n);
  std::vector<double> v_mine(counts[static_cast<std::size_t>(r)], static_cast<double>(r) + 0.5);
  std::vector<double> v_all(std::accumulate(counts.begin(), counts.end(), std::size_t{0}));

  std::vector<collective_request> reqs;
  reqs.push_back(c.template iallreduce<float>(std::span(sum), reduce_op::sum));
  reqs.push_back(c.template ibroadcast<float>(std::span(bcast), 0));
  reqs.push_back(c.template iallgather<std::int32_t>(mine, std::span(gathered)));
  reqs.push_back(c.template iallreduce<float>(std::span(mx), reduce_op::max));
  reqs.push_back(c.template iallgatherv<double>(v_mine, std::span(v_all), counts));
  reqs.push_back(c.ibarrier());
  // Each rank waits in its own order: rank r starts at request r and polls some with test().
  std::vector<std::size_t> order(reqs.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::rotate(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) % order.size()),
              order.end());
  if (r % 2 == 1) std::reverse(order.begin(), order.end());
  for (std::size_t k : order) {
    if (k % 2 == 0) {
      while (!reqs[k].test()) std::this_thread::yield();
    }
    reqs[k].wait();
  }
  // A blocking call right after more `i` calls runs after them, on every rank.
  std::vector<std::int64_t> late(n, 1);
  auto pending = c.template iallreduce<std::int64_t>(std::span(late), reduce_op::sum);
  std::vector<std::int64_t> now(n, 2);
  c.template allreduce<std::int64_t>(std::span(now), reduce_op::sum);
  pending.wait();

  for (std::size_t i = 0; i < n; ++i) {
    float s = 0, m = 0;
    for (int q = 0; q < p; ++q) {
      s += static_cast<float>(value(q, i) % 64);
      m = std::max(m, static_cast<float>(value(q, i) % 1000));
    }
    report(wrong, sum[i] == s && mx[i] == m, "iallreduce sum/max index " + std::to_string(i));
    report(wrong, bcast[i] == static_cast<float>(i), "ibroadcast index " + std::to_string(i));
    report(wrong, late[i] == p && now[i] == 2 * p, "blocking allreduce behind an iallreduce");
    for (int q = 0; q < p; ++q) {
      report(wrong, gathered[static_cast<std::size_t>(q) * n + i] == static_cast<std::int32_t>(value(q, i)),
             "iallgather");
    }
  }
  std::size_t at = 0;
  for (int q = 0; q < p; ++q) {
    for (std::size_t i = 0; i < counts[static_cast<std::size_t>(q)]; ++i) {
      report(wrong, v_all[at++] == static_cast<double>(q) + 0.5, "iallgatherv");
    }
  }
  return wrong;
}

// Two threads of every rank call allreduce on one communicator at once. Which call pairs with
// which across ranks is up to the scheduler, so every call reduces the same values: any pairing
// gives p, and a call that ran beside another (a data race) would not.
template <class Comm>
int two_threads(Comm& c, std::size_t n, int calls) {
  std::atomic<int> wrong{0};
  auto work = [&] {
    for (int k = 0; k < calls; ++k) {
      std::vector<std::int32_t> ones(n, 1);
      c.template allreduce<std::int32_t>(std::span(ones), reduce_op::sum);
      if (std::any_of(ones.begin(), ones.end(), [&](std::int32_t x) { return x != c.size(); })) ++wrong;
    }
  };
  std::thread other(work);
  work();
  other.join();
  return wrong.load();
}

}  // namespace dtrain::api_case
