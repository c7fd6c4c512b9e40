// Process groups and the device mesh, in process: rank lists against MPI's set semantics,
// split against a serial computation of MPI_Comm_split, tag isolation between groups, the
// mesh's coordinates and axis groups against the closed form of its rank order.

#include <algorithm>
#include <cstddef>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "../catch.hpp"
#include "dtrain/concepts/transport.hpp"
#include "dtrain/topology/mesh.hpp"
#include "dtrain/transport/group.hpp"
#include "dtrain/transport/inproc.hpp"
#include "../support/text.hpp"

using namespace dtrain;
using namespace std::chrono_literals;
using group = process_group<inproc_transport>;

static_assert(transport<group>);

namespace {

using dtrain::testing::has;

// MPI_Comm_split, serially: the world ranks of rank r's group, ordered by (order, rank).
std::vector<int> split_reference(const std::vector<int>& colors, const std::vector<int>& orders, int r) {
  if (colors[static_cast<std::size_t>(r)] == no_group) return {};
  std::vector<std::pair<int, int>> mine;
  for (int q = 0; q < static_cast<int>(colors.size()); ++q) {
    if (colors[static_cast<std::size_t>(q)] == colors[static_cast<std::size_t>(r)]) {
      mine.emplace_back(orders[static_cast<std::size_t>(q)], q);
    }
  }
  std::sort(mine.begin(), mine.end());
  std::vector<int> ranks;
  for (auto [o, q] : mine) ranks.push_back(q);
  return ranks;
}

}  // namespace

TEST_CASE("rank_list: incl, excl, union, intersection, difference in MPI's orders", "[transport][group]") {
  const rank_list a({5, 1, 3, 7});
  const rank_list b({3, 8, 5, 0});
  CHECK(a.incl(std::vector<int>{2, 0}) == rank_list({3, 5}));
  CHECK(a.excl(std::vector<int>{1}) == rank_list({5, 3, 7}));
  CHECK(union_of(a, b) == rank_list({5, 1, 3, 7, 8, 0}));
  CHECK(intersection_of(a, b) == rank_list({5, 3}));
  CHECK(difference_of(a, b) == rank_list({1, 7}));
  CHECK(a.index_of(3) == 2);
  CHECK(a.index_of(4) == -1);
  auto what_of = [](auto f) {
    try {
      f();
    } catch (const error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(has(what_of([] { rank_list({1, 2, 1}); }), "listed twice"));
  CHECK(has(what_of([&] { a.incl(std::vector<int>{4}); }), "outside a group of 4"));
}

TEST_CASE("split: every coloring and world size 1-9 forms MPI_Comm_split's groups", "[transport][group]") {
  struct coloring {
    const char* name;
    int (*color)(int r, int p);
    int (*order)(int r, int p);
  };
  const coloring colorings[] = {
      {"halves", [](int r, int) { return r % 2; }, [](int, int) { return 0; }},
      {"threes reversed", [](int r, int) { return r / 3; }, [](int r, int) { return -r; }},
      {"some left out", [](int r, int) { return r % 3 == 1 ? no_group : 7; }, [](int r, int) { return r % 2; }},
      {"one group, rotated", [](int, int) { return 0; }, [](int r, int p) { return (r + 2) % p; }},
  };
  for (const auto& c : colorings) {
    for (int p = 1; p <= 9; ++p) {
      std::vector<int> colors, orders;
      for (int r = 0; r < p; ++r) {
        colors.push_back(c.color(r, p));
        orders.push_back(c.order(r, p));
      }
      std::vector<std::vector<int>> got(static_cast<std::size_t>(p));
      std::vector<int> ranks(static_cast<std::size_t>(p), -2);
      run_inproc(p, [&](int r, inproc_transport t) {
        group world(std::move(t));
        std::optional<group> g = world.split(colors[static_cast<std::size_t>(r)], orders[static_cast<std::size_t>(r)]);
        if (!g) return;
        got[static_cast<std::size_t>(r)].assign(g->members().ranks().begin(), g->members().ranks().end());
        ranks[static_cast<std::size_t>(r)] = g->rank();
      });
      for (int r = 0; r < p; ++r) {
        INFO(c.name << ", p = " << p << ", rank " << r);
        const auto want = split_reference(colors, orders, r);
        CHECK(got[static_cast<std::size_t>(r)] == want);
        const auto at = std::find(want.begin(), want.end(), r);
        CHECK(ranks[static_cast<std::size_t>(r)] == (want.empty() ? -2 : static_cast<int>(at - want.begin())));
      }
    }
  }
}

TEST_CASE("groups: a message stays in its group's tag space, and any_peer answers with group ranks",
          "[transport][group]") {
  // Ranks 1 and 3 are in both the world and the odd group: the same tag on each must not mix.
  std::vector<std::string> seen(4);
  run_inproc(4, [&](int r, inproc_transport t) {
    group world(std::move(t));
    auto odd = world.split(r % 2 == 1 ? 1 : no_group);
    if (r == 3) {
      int a = 111, b = 222;
      auto s1 = world.isend(1, 5, signature{}, std::as_bytes(std::span(&a, 1)));
      auto s2 = odd->isend(0, 5, signature{}, std::as_bytes(std::span(&b, 1)));
      s1.wait(deadline::after(10s));
      s2.wait(deadline::after(10s));
    }
    if (r == 1) {
      int from_group = 0, from_world = 0;
      // The group's receive is posted first, from any peer; it must get the group's message.
      auto g = odd->irecv(any_peer, 5, std::as_writable_bytes(std::span(&from_group, 1)));
      auto w = world.irecv(3, 5, std::as_writable_bytes(std::span(&from_world, 1)));
      g.wait(deadline::after(10s));
      w.wait(deadline::after(10s));
      seen[1] = std::to_string(from_group) + " from group rank " + std::to_string(g.info().peer) + " tag " +
                std::to_string(g.info().tag) + "; " + std::to_string(from_world) + " from world rank " +
                std::to_string(w.info().peer);
    }
  });
  CHECK(seen[1] == "222 from group rank 1 tag 5; 111 from world rank 3");
}

TEST_CASE("groups: form builds a group from a rank list, and errors name the group and both ranks",
          "[transport][group]") {
  std::vector<std::string> errors(4);
  run_inproc(4, [&](int r, inproc_transport t) {
    group world(std::move(t), 200ms);
    const rank_list evens_reversed({2, 0});
    auto g = world.form(evens_reversed, "evens");
    if (r % 2 == 1) {
      errors[static_cast<std::size_t>(r)] = g ? "formed" : "not a member";
      return;
    }
    if (!g) {
      errors[static_cast<std::size_t>(r)] = "missing";
      return;
    }
    if (g->rank() == 1) {  // world rank 0 never answers, but stays (leaving would be peer_lost)
      std::this_thread::sleep_for(400ms);
      return;
    }
    int v = 0;
    auto q = g->irecv(1, 9, std::as_writable_bytes(std::span(&v, 1)));
    try {
      q.wait(deadline::after(100ms));
    } catch (const error& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  CHECK(errors[1] == "not a member");
  CHECK(errors[3] == "not a member");
  CHECK(has(errors[2], "rank 1 of group 'evens' (world rank 0)"));
  CHECK(has(errors[2], "deadline exceeded"));
}

TEST_CASE("groups: split refuses a bad color and times out naming who did not take part", "[transport][group]") {
  std::vector<std::string> errors(3);
  run_inproc(3, [&](int r, inproc_transport t) {
    group world(std::move(t), 200ms);
    try {
      if (r == 0) world.split(-5);
      if (r == 1) world.split(0);  // rank 2 never splits; rank 0 threw before sending
    } catch (const error& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
    if (r != 1) std::this_thread::sleep_for(400ms);  // stay: a rank that leaves is peer_lost
  });
  CHECK(has(errors[0], "color -5 is negative"));
  CHECK(has(errors[1], "process_group::split on rank 1"));
  CHECK(has(errors[1], ": rank 0, rank 2 did not take part by the deadline"));  // both named, no tag
  CHECK(has(errors[1], "deadline exceeded"));
}

TEST_CASE("device_mesh: coordinates, rank order (last axis innermost) and axis groups", "[transport][group]") {
  const std::vector<mesh_axis> axes{{"dp", 3}, {"pp", 2}, {"tp", 2}};
  constexpr int p = 12;
  std::vector<std::map<std::string, std::vector<int>>> groups(p);
  std::vector<std::map<std::string, std::string>> names(p);
  std::vector<std::vector<int>> coords(p);
  run_inproc(p, [&](int r, inproc_transport t) {
    device_mesh<inproc_transport> mesh(group(std::move(t)), axes);
    coords[static_cast<std::size_t>(r)] = mesh.coordinates();
    for (const auto& a : axes) {
      const auto m = mesh.group(a.name).members().ranks();
      groups[static_cast<std::size_t>(r)][a.name].assign(m.begin(), m.end());
      names[static_cast<std::size_t>(r)][a.name] = mesh.group(a.name).name();
    }
  });
  // Errors name a group as the axis at the other axes' coordinates, without a stray separator.
  CHECK(names[0]["tp"] == "mesh:tp@dp0,pp0");
  CHECK(names[0]["dp"] == "mesh:dp@pp0,tp0");
  CHECK(names[7]["pp"] == "mesh:pp@dp1,tp1");
  for (int r = 0; r < p; ++r) {
    const int dp = r / 4, pp = (r / 2) % 2, tp = r % 2;  // rank = (dp * 2 + pp) * 2 + tp
    INFO("rank " << r);
    CHECK(coords[static_cast<std::size_t>(r)] == std::vector<int>{dp, pp, tp});
    auto& g = groups[static_cast<std::size_t>(r)];
    CHECK(g["tp"] == std::vector<int>{(dp * 2 + pp) * 2, (dp * 2 + pp) * 2 + 1});
    CHECK(g["pp"] == std::vector<int>{dp * 4 + tp, dp * 4 + 2 + tp});
    CHECK(g["dp"] == std::vector<int>{pp * 2 + tp, 4 + pp * 2 + tp, 8 + pp * 2 + tp});
  }
  std::vector<std::string> errors(4);
  run_inproc(4, [&](int r, inproc_transport t) {
    try {
      device_mesh<inproc_transport> bad(group(std::move(t)), {{"dp", 3}, {"tp", 2}});
    } catch (const error& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  for (const auto& e : errors) CHECK(has(e, "hold 6 ranks but the group has 4"));
}

TEST_CASE("device_mesh: a one-axis mesh names its group by the axis alone", "[transport][group]") {
  std::vector<std::string> names(2);
  run_inproc(2, [&](int r, inproc_transport t) {
    device_mesh<inproc_transport> mesh(group(std::move(t)), {{"dp", 2}});
    names[static_cast<std::size_t>(r)] = mesh.group("dp").name();
  });
  CHECK(names == std::vector<std::string>{"mesh:dp", "mesh:dp"});
}
