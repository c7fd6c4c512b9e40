// Messages that arrive before their receive: the TCP transport holds them in buffers it keeps for
// the next ones (detail::buffer_pool). The pool's rules against what they promise, then real TCP
// ranks: batches of large early messages, from a peer and from the rank itself, every byte
// checked after the buffers have been reused.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <set>
#include <span>
#include <vector>

#include "../catch.hpp"
#include "../support/thread_checks.hpp"
#include "../support/thread_ranks.hpp"
#include "dtrain/detail/buffer_pool.hpp"
#include "dtrain/transport/tcp.hpp"

using namespace dtrain;
using namespace std::chrono_literals;
using detail::buffer_pool;

TEST_CASE("buffer pool: a buffer given back serves the next request it fits, the smallest that fits",
          "[tcp][early]") {
  const std::size_t min = buffer_pool::min_bytes, max = buffer_pool::max_bytes;
  static_assert(buffer_pool::min_bytes * 4 < buffer_pool::max_bytes, "the sizes below lie between the bounds");
  buffer_pool pool;
  auto a = pool.take(min + 1);
  auto b = pool.take(max / 2);
  REQUIRE(a.capacity >= min + 1);
  REQUIRE(b.capacity >= max / 2);
  const std::byte* a_at = a.data.get();
  const std::byte* b_at = b.data.get();
  pool.give(std::move(b));
  pool.give(std::move(a));
  CHECK(pool.kept() == 2);
  auto c = pool.take(min);  // both fit: the smaller one
  CHECK(c.data.get() == a_at);
  auto d = pool.take(max / 2 - 1);
  CHECK(d.data.get() == b_at);
  CHECK(pool.kept() == 0);
  pool.give(std::move(c));
  auto e = pool.take(min + 2);  // the one kept is too small: a new one, and it stays kept
  CHECK(e.data.get() != a_at);
  CHECK(e.capacity == min + 2);
  CHECK(pool.kept() == 1);
}

TEST_CASE("buffer pool: small and huge buffers are not kept, and only a few are", "[tcp][early]") {
  buffer_pool pool;
  auto made = [](std::size_t n) { return buffer_pool::buffer{std::make_unique_for_overwrite<std::byte[]>(n), n}; };
  pool.give(made(buffer_pool::min_bytes - 1));
  pool.give(made(buffer_pool::max_bytes + 1));
  pool.give({});
  CHECK(pool.kept() == 0);
  static_assert(buffer_pool::max_kept == 4, "the sizes expected below are four");
  const std::size_t min = buffer_pool::min_bytes;
  for (std::size_t i = 0; i < buffer_pool::max_kept + 2; ++i) pool.give(made(min + i));
  CHECK(pool.kept() == buffer_pool::max_kept);
  // Full: a larger buffer displaces the smallest kept, a smaller one is freed.
  pool.give(made(buffer_pool::max_bytes));
  pool.give(made(min));
  CHECK(pool.kept() == buffer_pool::max_kept);
  std::multiset<std::size_t> sizes;
  for (std::size_t i = 0; i < buffer_pool::max_kept; ++i) sizes.insert(pool.take(min).capacity);
  CHECK(sizes == std::multiset<std::size_t>{min + 3, min + 4, min + 5, buffer_pool::max_bytes});
}

namespace {

// Message i of a batch: sizes across the pool's bounds, contents that differ by batch and index.
std::vector<std::uint32_t> message(int batch, int i) {
  static constexpr std::size_t sizes[] = {(300u << 10) / 4, (70u << 10) / 4, (1u << 20) / 4 + 3, (5u << 20) / 4, 17};
  std::vector<std::uint32_t> v(sizes[static_cast<std::size_t>(i) % std::size(sizes)]);
  const auto first = static_cast<std::uint32_t>(batch * 1000003 + i * 7919);
  for (std::size_t k = 0; k < v.size(); ++k) v[k] = first + static_cast<std::uint32_t>(k);
  return v;
}

}  // namespace

TEST_CASE("tcp: early messages, from a peer and from itself, arrive whole while their buffers are reused",
          "[tcp][early]") {
  constexpr int batches = 3, per_batch = 12;
  tcp_options o;
  o.timeout = 30s;
  auto connect = [&](tcp_store& store, int r) { return tcp_transport::connect(store, r, 2, o, "127.0.0.1"); };
  testing::run_thread_ranks(2, "test-token", connect, [&](int r, tcp_transport& t) {
    std::vector<std::byte> marker(1);
    for (int batch = 0; batch < batches; ++batch) {
      std::vector<std::vector<std::uint32_t>> out;
      std::vector<tcp_request> sends;
      for (int i = 0; i < per_batch; ++i) {
        out.push_back(message(batch * 2 + r, i));
        sends.push_back(t.isend(1 - r, 11, signature{}, std::as_bytes(std::span(out.back()))));
        sends.push_back(t.isend(r, 12, signature{}, std::as_bytes(std::span(out.back()))));
      }
      // After the batch on the same connection: once it is in, the whole batch is (TCP keeps the
      // order), every message of it early.
      sends.push_back(t.isend(1 - r, 13, signature{}, marker));
      auto in_marker = t.irecv(1 - r, 13, marker);
      in_marker.wait(deadline::after(30s));  // throws on a timeout or a lost peer
      for (int i = 0; i < per_batch; ++i) {
        for (int from : {1 - r, r}) {
          const auto expected = message(batch * 2 + from, i);
          std::vector<std::uint32_t> in(expected.size(), 0xdeadbeef);
          auto req = t.irecv(from, from == r ? 12 : 11, std::as_writable_bytes(std::span(in)));
          req.wait(deadline::after(30s));
          TCHECK(req.info().bytes == expected.size() * 4);
          const auto wrong = std::mismatch(in.begin(), in.end(), expected.begin()).first - in.begin();
          TCHECK(static_cast<std::size_t>(wrong) == in.size());  // else the first wrong element
        }
      }
      for (auto& s : sends) s.wait(deadline::after(30s));
    }
  });
}
