// Collectives on process groups, in process: every collective and algorithm on the groups of
// several splits (world sizes 1-9) and on every axis of a mesh, all groups of a world running at
// once, bit for bit against the serial reference of conformance_case.hpp; two groups reducing
// on two threads of every rank at once; a mismatch inside a group named with the group.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "../catch.hpp"
#include "conformance_case.hpp"
#include "group_case.hpp"
#include "dtrain/collective/communicator.hpp"
#include "dtrain/topology/mesh.hpp"
#include "dtrain/transport/group.hpp"
#include "dtrain/transport/inproc.hpp"
#include "../support/text.hpp"

using namespace dtrain;
using namespace dtrain::conformance;
using namespace std::chrono_literals;
using group = process_group<inproc_transport>;
using group_comm = communicator<group>;

namespace {

using dtrain::testing::has;

}  // namespace

TEST_CASE("groups: every collective and algorithm on the groups of a split, world sizes 1-9", "[collective][group]") {
  struct coloring {
    const char* name;
    int (*color)(int r);
    int (*order)(int r);
  };
  const coloring colorings[] = {
      {"halves", [](int r) { return r % 2; }, [](int) { return 0; }},
      {"threes reversed", [](int r) { return r / 3; }, [](int r) { return -r; }},
      {"some left out", [](int r) { return r % 3 == 1 ? no_group : 0; }, [](int r) { return r % 2; }},
  };
  cases_run = 0;
  for (const auto& c : colorings) {
    for (int p = 1; p <= 9; ++p) {
      std::atomic<int> wrong{0};
      std::string first;
      std::mutex m;
      run_inproc(p, [&](int r, inproc_transport t) {
        group world(std::move(t));
        std::optional<group> g = world.split(c.color(r), c.order(r));
        if (!g) return;
        std::string mine;
        const int w = run_all_types_on<group>(*g, mine);
        wrong += w;
        std::lock_guard lock(m);
        if (w > 0 && first.empty()) first = mine;
      });
      INFO(c.name << ", p = " << p << ": " << first);
      CHECK(wrong.load() == 0);
    }
  }
  CHECK(cases_run.load() > 10000);
}

TEST_CASE("groups: every collective and algorithm along every axis of a 2 x 3 x 2 mesh", "[collective][group]") {
  cases_run = 0;
  std::atomic<int> wrong{0};
  std::string first;
  std::mutex m;
  run_inproc(12, [&](int, inproc_transport t) {
    device_mesh<inproc_transport> mesh(group(std::move(t)), {{"dp", 2}, {"pp", 3}, {"tp", 2}});
    for (const char* axis : {"dp", "pp", "tp"}) {
      std::string mine;
      const int w = run_all_types_on<group>(mesh.group(axis), mine);
      wrong += w;
      std::lock_guard lock(m);
      if (w > 0 && first.empty()) first = mine;
    }
  });
  INFO(first);
  CHECK(wrong.load() == 0);
  CHECK(cases_run.load() > 1000);
}

TEST_CASE("groups: groups of the same ranks reduce at once on three threads of every rank", "[collective][group]") {
  // 6 ranks as 2 rows x 3 columns. Each rank reduces, 200 times and each time with other values,
  // on three threads: over its row, over the same ranks formed again under another name, and
  // over its column. The first two move messages between the same pairs of ranks on the same
  // communicator tag: only the groups' tag spaces keep them apart, and a crossed message is a
  // wrong sum or a mismatch.
  constexpr int rounds = 200;
  std::atomic<int> wrong{0};
  run_inproc(6, [&](int r, inproc_transport t) {
    group world(std::move(t));
    group row = *world.split(r / 3, r);
    group row_again = *world.form(row.members(), "the row, again");
    group column = *world.split(r % 3, r);
    auto reduce_many = [&](group& g, int salt) {
      group_comm c(g);
      for (int i = 0; i < rounds; ++i) {
        std::vector<std::int64_t> v(64 + i % 5, std::int64_t{r} * salt + i);
        c.allreduce(std::span(v), reduce_op::sum);
        std::int64_t want = 0;
        for (int w : g.members().ranks()) want += std::int64_t{w} * salt + i;
        wrong += static_cast<int>(std::count_if(v.begin(), v.end(), [&](std::int64_t x) { return x != want; }));
      }
    };
    std::exception_ptr failed[2];  // the other threads' errors, rethrown after the joins
    auto guarded = [&](group& g, int salt, std::exception_ptr& e) {
      try {
        reduce_many(g, salt);
      } catch (...) {
        e = std::current_exception();
      }
    };
    std::thread second([&] { guarded(row_again, 1000, failed[0]); });
    std::thread third([&] { guarded(column, 100000, failed[1]); });
    reduce_many(row, 7);
    second.join();
    third.join();
    for (auto& e : failed) {
      if (e) std::rethrow_exception(e);
    }
  });
  CHECK(wrong.load() == 0);
}

TEST_CASE("groups: a mismatch inside a group names the group and both ranks' calls", "[collective][group]") {
  std::vector<std::string> errors(4);
  run_inproc(4, [&](int r, inproc_transport t) {
    group world(std::move(t));
    group odd_even = *world.split(r % 2);
    communicator_options o;
    o.timeout = 2s;
    group_comm c(odd_even, o);
    // In the even group (world ranks 0 and 2), world rank 2 reduces 5 elements where 0 reduces 4.
    std::vector<float> v(r == 2 ? 5 : 4, 1.0f);
    try {
      c.allreduce(std::span(v), reduce_op::sum);
    } catch (const error& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  CHECK(errors[1].empty());
  CHECK(errors[3].empty());
  for (int r : {0, 2}) {
    INFO(errors[static_cast<std::size_t>(r)]);
    CHECK(has(errors[static_cast<std::size_t>(r)], "collective mismatch"));
    CHECK(has(errors[static_cast<std::size_t>(r)], "of group 'world/split0:color0'"));
    CHECK(has(errors[static_cast<std::size_t>(r)], r == 0 ? "(world rank 2)" : "(world rank 0)"));
  }
}
