// The double binary tree's shape, for every group size up to 300: both trees span the group
// (every rank reaches the root, parents and children agree, at most two children), their depth
// is logarithmic, and leaves alternate: the first tree's leaves are exactly the odd ranks and,
// for even sizes, the second tree's exactly the even ones, so no rank is inner in both.
// (Its results are checked with every other algorithm in conformance.cpp.)

#include <cmath>
#include <string>
#include <vector>

#include "../catch.hpp"
#include "dtrain/collective/double_tree.hpp"

using namespace dtrain::detail;

namespace {

// "" if the trees of `shape(r, p)` over p ranks form one tree rooted at `root`, else what is wrong.
template <class Shape>
std::string check_tree(int p, int root, Shape shape, int& depth) {
  std::vector<tree_shape> t;
  for (int r = 0; r < p; ++r) t.push_back(shape(r, p));
  depth = 0;
  for (int r = 0; r < p; ++r) {
    const tree_shape& s = t[static_cast<std::size_t>(r)];
    if ((s.parent < 0) != (r == root)) return "rank " + std::to_string(r) + " has parent " + std::to_string(s.parent);
    if (s.children.size() > 2) return "rank " + std::to_string(r) + " has more than two children";
    for (int c : s.children) {
      if (c < 0 || c >= p || t[static_cast<std::size_t>(c)].parent != r) {
        return "rank " + std::to_string(r) + " lists child " + std::to_string(c) + " whose parent differs";
      }
    }
    int d = 0;
    for (int x = r; x != root; x = t[static_cast<std::size_t>(x)].parent) {
      if (++d > p) return "rank " + std::to_string(r) + " never reaches the root";
    }
    depth = std::max(depth, d);
  }
  return {};
}

}  // namespace

TEST_CASE("double binary tree: two spanning trees of logarithmic depth whose leaves alternate", "[collective]") {
  for (int p = 1; p <= 300; ++p) {
    INFO("p = " << p);
    int depth1 = 0, depth2 = 0;
    CHECK(check_tree(p, 0, first_btree, depth1).empty());
    const int root2 = p % 2 == 0 ? p - 1 : 1 % p;
    CHECK(check_tree(p, root2, second_btree, depth2).empty());
    const int bound = static_cast<int>(std::ceil(std::log2(p + 1))) + 1;
    CHECK(depth1 <= bound);
    CHECK(depth2 <= bound);
    for (int r = 0; r < p; ++r) {
      const bool leaf1 = first_btree(r, p).children.empty();
      if (p > 1) CHECK(leaf1 == (r % 2 == 1));
      if (p % 2 == 0) CHECK(second_btree(r, p).children.empty() == (r % 2 == 0));
    }
  }
}
