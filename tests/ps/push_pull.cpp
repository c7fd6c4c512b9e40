// Servers and workers as threads of one process: push_pull against a push then a pull, key
// caching (the bytes it saves, and a slot the server does not hold refused) and bounded delay's
// window of tasks in flight, against what a serial run sees.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../catch.hpp"
#include "inproc_job.hpp"

using namespace dtrain;
using namespace dtrain::ps;
using namespace std::chrono_literals;
using namespace dtrain::ps_job;

namespace {

// What one worker saw over a run of push-and-pull rounds, and what it sent.
struct rounds_seen {
  std::vector<std::vector<float>> pulled;  // sparse then dense values, per round
  std::uint64_t bytes_out = 0;
};

// `rounds` rounds of: gradient from the last values seen, push it, read the values back, finish
// the clock; over two alternating sparse key lists (both servers' shares) and a dense tensor of
// several slices. `fused` uses push_pull; `cache_lists` sets key caching (0: off).
template <class Consistency>
std::vector<rounds_seen> push_pull_rounds(int workers, bool fused, std::size_t cache_lists) {
  constexpr int rounds = 8;
  constexpr std::size_t dense_n = 3000;
  ps_options o = quick();
  o.key_cache_lists = cache_lists;
  o.key_cache_min_keys = 16;
  o.dense_slice_bytes = 4096;  // three slices of the dense tensor
  std::vector<std::vector<key_type>> lists(2);
  for (key_type k = 0; k < 500; ++k) {
    lists[0].push_back(k * 2000 + 1);
    lists[1].push_back(k * 2000 + 2 + k % 3);
  }
  std::vector<rounds_seen> seen(static_cast<std::size_t>(workers));  // by worker, each written by its own thread
  run_job<Consistency>(2, workers, [&](auto& w) {
    rounds_seen& mine_seen = seen[static_cast<std::size_t>(w.id())];
    const auto t = w.add_dense(dense_n);
    std::vector<std::vector<float>> values(2, std::vector<float>(500));
    std::vector<float> x(dense_n), grads(500), dense_grads(dense_n);
    for (int r = 0; r < rounds; ++r) {
      const auto& keys = lists[static_cast<std::size_t>(r % 2)];
      auto& mine = values[static_cast<std::size_t>(r % 2)];
      for (std::size_t i = 0; i < keys.size(); ++i) grads[i] = gradient(w.id(), r, keys[i], mine[i]);
      for (std::size_t i = 0; i < dense_n; ++i) dense_grads[i] = gradient(w.id(), r, i, x[i]);
      if (fused) {
        auto a = w.push_pull(keys, std::span<const float>(grads), std::span(mine), 1);
        auto b = w.push_pull_dense(t, dense_grads, x);
        w.wait(a);
        w.wait(b);
      } else {
        auto a = w.push(keys, std::span<const float>(grads), 1);
        auto b = w.push_dense(t, dense_grads);
        auto c = w.pull(keys, std::span(mine), 1);
        auto d = w.pull_dense(t, x);
        w.wait(a);
        w.wait(b);
        w.wait(c);
        w.wait(d);
      }
      auto clocked = w.clock();
      w.wait(clocked);
      mine_seen.pulled.push_back(mine);
      mine_seen.pulled.back().insert(mine_seen.pulled.back().end(), x.begin(), x.end());
    }
    mine_seen.bytes_out = w.stats().bytes_out;
  }, apply_mode::update, 0.1, o);
  return seen;
}

template <class Consistency>
void check_push_pull_matches(int workers) {
  const auto reference = push_pull_rounds<Consistency>(workers, false, 0);
  const auto fused = push_pull_rounds<Consistency>(workers, true, 16);
  const auto evicting = push_pull_rounds<Consistency>(workers, true, 1);  // one slot: every list is stored anew
  const auto separate_cached = push_pull_rounds<Consistency>(workers, false, 16);
  for (std::size_t w = 0; w < reference.size(); ++w) {  // every worker's view counts
    INFO("worker " << w);
    REQUIRE(reference[w].pulled.size() == 8);
    CHECK(reference[w].pulled.front() != reference[w].pulled.back());  // the values moved
    CHECK(fused[w].pulled == reference[w].pulled);
    CHECK(evicting[w].pulled == reference[w].pulled);
    CHECK(separate_cached[w].pulled == reference[w].pulled);
    // Cached lists travel as a slot: from the third round on, no keys are sent (8 bytes each).
    CHECK(separate_cached[w].bytes_out + 2 * 6 * 500 * 8 <= reference[w].bytes_out);
    CHECK(evicting[w].bytes_out > fused[w].bytes_out);
  }
}

}  // namespace

TEST_CASE("push_pull answers as a push then a pull, cached key lists change nothing but the bytes", "[ps]") {
  SECTION("ASP, one worker") { check_push_pull_matches<asp>(1); }
  SECTION("SSP(1), one worker") { check_push_pull_matches<ssp<1>>(1); }
  SECTION("BSP, three workers") { check_push_pull_matches<bsp>(3); }
}

TEST_CASE("a request naming a key cache slot the server does not hold is refused", "[ps]") {
  const roles r = roles::of(2, 1);
  std::string refusal;
  run_inproc(2, [&](int rank, inproc_transport t) {
    if (r.is_server(rank)) {
      server<inproc_transport, asp, float, sgd<float>> s(std::move(t), r, asp{}, sgd<float>(0.1), {}, quick());
      s.run();
      return;
    }
    const ps_options o = quick();
    auto exchange = [&](const request_header& h, std::span<const std::uint64_t> keys, std::span<const float> values) {
      const message m = encode_request<float>(h, keys, values);
      t.isend(0, o.tag, signature{}, m.bytes()).wait(deadline::after(o.timeout));
      std::vector<std::byte> reply;
      t.irecv(0, reply_tag(o.tag, h.id), reply).wait(deadline::after(o.timeout));
      const auto rh = decode_response(reply, 0);
      return rh.status == 0 ? std::string() : std::string(reinterpret_cast<const char*>(reply.data()) + header_bytes,
                                                           reply.size() - header_bytes);
    };
    const auto config = job_configuration{r, asp::name, sizeof(float), 1}.words();
    exchange({op::hello, table_id::sparse, 1, 0, 0, config.size(), 0, 0}, config, {});
    const std::vector<float> values(3, 1.0f);
    refusal = exchange({op::push, table_id::sparse, 2, 0, 0, 3, 1, 0, key_cache::use, 9}, {}, values);
    exchange({op::goodbye, table_id::sparse, 3, 0, 0, 0, 0, 0}, {}, {});
  });
  CHECK_THAT(refusal,
             Catch::Contains("push from worker 0 names key cache slot 9 with 3 keys, but the slot holds 0 keys"));
}

TEST_CASE("bounded delay: a worker's push_pull tasks, tau + 1 in flight, see every task before t - tau", "[ps]") {
  // Sum mode: each task adds 1 to the key and reads it back in the same pass. Task t starts once
  // every task below t - tau finished, so it reads at least t - tau + 1 (those and its own) and
  // at most t + 1 (every task started so far).
  for (std::int64_t tau : {0, 1, 3}) {
    INFO("tau " << tau);
    constexpr std::int64_t tasks = 40;
    std::vector<float> seen(tasks, -1.0f);
    const std::vector<key_type> key{3};
    run_job<bounded_delay<3>>(2, 1, [&](auto& w) {  // the servers act as under ASP whatever tau
      const std::vector<float> one{1.0f};
      auto finish = [&](typename std::remove_reference_t<decltype(w)>::request& r) { w.wait(r); };
      task_window<typename std::remove_reference_t<decltype(w)>::request, decltype(finish)> window(tau, finish);
      for (std::int64_t t = 0; t < tasks; ++t) {
        window.admit(t);
        window.started(t, w.push_pull(key, std::span<const float>(one),
                                      std::span(seen).subspan(static_cast<std::size_t>(t), 1), 1));
      }
      window.drain();
    }, apply_mode::sum);
    for (std::int64_t t = 0; t < tasks; ++t) {
      CHECK(seen[static_cast<std::size_t>(t)] >= static_cast<float>(t - tau + 1));
      CHECK(seen[static_cast<std::size_t>(t)] <= static_cast<float>(t + 1));
      if (tau == 0) CHECK(seen[static_cast<std::size_t>(t)] == static_cast<float>(t + 1));  // sequential
    }
  }
}
