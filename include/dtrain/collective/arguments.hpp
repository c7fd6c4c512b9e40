#pragma once
// The argument checks of a host communicator's collectives, shared by its blocking and `v`
// forms: each failure is `errc::invalid_argument` naming the rank and the operation.

#include <cstddef>
#include <functional>
#include <span>
#include <string>

#include "dtrain/concepts/element.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/signature.hpp"

namespace dtrain::detail {

/// Checks for `Derived`, which has `rank()` and `size()`.
template <class Derived>
class argument_checks {
 protected:
  void check(bool ok, coll_op op, const char* what) const {
    if (!ok) {
      throw error(errc::invalid_argument, "dtrain: rank " + std::to_string(self().rank()) + ": " +
                                              std::string(coll_op_name(op)) + ": " + what);
    }
  }

  void check_root(int root, coll_op op) const {
    check(root >= 0 && root < self().size(), op, "root is not a rank of the group");
  }

  // Gather and scatter: a valid root, and at the root a buffer of size() blocks (`all`
  // elements) of the other side's one block (`block`), not overlapping it.
  template <element T>
  void check_rooted_blocks(coll_op op, int root, std::span<const T> in, std::span<T> out, std::size_t all,
                           std::size_t block, const char* what) const {
    check_root(root, op);
    if (self().rank() != root) return;
    check(all == block * static_cast<std::size_t>(self().size()), op, what);
    check_no_overlap(in, out, op);
  }

  template <class T>
  static bool overlaps(std::span<const T> a, std::span<T> b) noexcept {
    if (a.empty() || b.empty()) return false;
    auto lt = std::less<const T*>{};
    return lt(a.data(), b.data() + b.size()) && lt(b.data(), a.data() + a.size());
  }

  // Out-of-place buffers must not overlap; the same buffer for both is the in-place form.
  template <class T>
  void check_no_overlap(std::span<const T> in, std::span<T> out, coll_op op) const {
    check(in.data() == out.data() || !overlaps(in, out), op, "in and out overlap");
  }

 private:
  const Derived& self() const noexcept { return static_cast<const Derived&>(*this); }
};

}  // namespace dtrain::detail
