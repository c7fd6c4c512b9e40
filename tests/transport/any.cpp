// any_transport: every collective over an erased in-process transport matches the serial
// reference, and errors (timeouts, truncation) keep naming the peer and operation.

#include <atomic>
#include <chrono>
#include <span>
#include <string>
#include <vector>

#include "../catch.hpp"
#include "../collective/conformance_case.hpp"
#include "dtrain/collective/communicator.hpp"
#include "dtrain/concepts/transport.hpp"
#include "dtrain/transport/any.hpp"
#include "dtrain/transport/inproc.hpp"
#include "parts_case.hpp"

using namespace dtrain;
using namespace dtrain::conformance;
using namespace std::chrono_literals;

static_assert(transport<any_transport>);

TEST_CASE("any_transport: every collective over an erased transport matches the reference", "[transport][any]") {
  for (coll_op op : {coll_op::broadcast, coll_op::reduce, coll_op::allreduce, coll_op::allgather,
                     coll_op::reduce_scatter, coll_op::gather, coll_op::scatter, coll_op::alltoall}) {
    for (int p : {1, 3, 4}) {
      const spec s{op, algorithm::ring, p, 1000, reduce_op::sum, p - 1, false};
      const auto expect = expected_results<float>(s);
      std::atomic<int> wrong{0};
      run_inproc(p, [&](int r, inproc_transport t) {
        communicator<any_transport> c{any_transport(std::move(t))};  // the default algorithms
        run_rank<float>(s, r, c, expect, [&](int, std::span<const float> got, const auto& want) {
          for (std::size_t i = 0; i < got.size(); ++i) wrong += got[i] == want(i) ? 0 : 1;
        });
      });
      INFO(describe_case(s, dtype::float32));
      CHECK(wrong.load() == 0);
    }
  }
}

TEST_CASE("any_transport: gathered sends and scattered receives pass through", "[transport][any]") {
  parts_case::tally t;
  run_inproc(2, [&](int r, inproc_transport e) {
    any_transport erased(std::move(e));
    parts_case::run(r, erased, t.checker());
  });
  for (const auto& what : t.failed) FAIL_CHECK(what);
  CHECK(t.checks == parts_case::expected_checks);
}

TEST_CASE("any_transport: a timeout and a truncation still name the peer", "[transport][any]") {
  auto group = make_inproc_group(2);
  any_transport a(std::move(group[0])), b(std::move(group[1]));
  std::vector<std::byte> small(4), big(16);
  auto r = a.irecv(1, 7, std::span(small));
  std::error_code ec;
  CHECK_FALSE(r.wait(deadline::after(50ms), ec));
  CHECK(ec == errc::timeout);
  auto s = b.isend(0, 7, signature{}, std::span<const std::byte>(big));
  try {
    r.wait(deadline::after(5s));
    FAIL("a 16-byte message fit a 4-byte buffer");
  } catch (const error& e) {
    CHECK(e.code() == errc::message_truncated);
    CHECK(std::string(e.what()).find("rank 1") != std::string::npos);
  }
  CHECK(r.info().peer == 1);
  s.wait(deadline::after(5s), ec);
}
