#pragma once
/// @file
/// `rank_list`: the world ranks of a group, in group order: what MPI calls a group before it is
/// a communicator. Lists are plain values, so any rank can compute any group (its own or not)
/// with `incl`, `excl`, `union_of`, `intersection_of` and `difference_of` (MPI_Group_incl,
/// _excl, _union, _intersection, _difference, with MPI's orders), then form a `process_group`
/// from one it belongs to.

#include <algorithm>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/core/error.hpp"

namespace dtrain {

class rank_list {
 public:
  rank_list() = default;

  /// @throws dtrain::error `invalid_argument` if a rank is negative or listed twice.
  explicit rank_list(std::vector<int> world_ranks) : ranks_(std::move(world_ranks)) {
    std::vector<int> sorted = ranks_;
    std::sort(sorted.begin(), sorted.end());
    if (!sorted.empty() && sorted.front() < 0) {
      throw error(errc::invalid_argument, "rank_list: rank " + std::to_string(sorted.front()) + " is negative");
    }
    if (auto twice = std::adjacent_find(sorted.begin(), sorted.end()); twice != sorted.end()) {
      throw error(errc::invalid_argument, "rank_list: rank " + std::to_string(*twice) + " is listed twice");
    }
  }

  /// World ranks first, first + 1, ..., last - 1.
  static rank_list range(int first, int last) {
    std::vector<int> r;
    for (int i = first; i < last; ++i) r.push_back(i);
    return rank_list(std::move(r));
  }

  std::span<const int> ranks() const noexcept { return ranks_; }
  int size() const noexcept { return static_cast<int>(ranks_.size()); }
  bool empty() const noexcept { return ranks_.empty(); }
  /// The world rank of group rank `i`.
  int operator[](int i) const { return ranks_.at(static_cast<std::size_t>(i)); }

  /// The group rank of world rank `w`, or -1 if it is not a member.
  int index_of(int w) const noexcept {
    auto it = std::find(ranks_.begin(), ranks_.end(), w);
    return it == ranks_.end() ? -1 : static_cast<int>(it - ranks_.begin());
  }
  bool contains(int w) const noexcept { return index_of(w) >= 0; }

  /// The members at group ranks `positions`, in that order (MPI_Group_incl).
  /// @throws dtrain::error `invalid_argument` for a position outside the list or given twice.
  rank_list incl(std::span<const int> positions) const {
    std::vector<int> r;
    for (int i : positions) r.push_back(at(i, "incl"));
    return rank_list(std::move(r));
  }

  /// Every member but those at group ranks `positions`, in list order (MPI_Group_excl).
  rank_list excl(std::span<const int> positions) const {
    std::vector<bool> gone(ranks_.size(), false);
    for (int i : positions) gone[static_cast<std::size_t>(index_in_range(i, "excl"))] = true;
    std::vector<int> r;
    for (std::size_t i = 0; i < ranks_.size(); ++i) {
      if (!gone[i]) r.push_back(ranks_[i]);
    }
    return rank_list(std::move(r));
  }

  friend bool operator==(const rank_list&, const rank_list&) = default;

  /// "[0, 2, 5]", for messages.
  std::string text() const {
    std::string s = "[";
    for (std::size_t i = 0; i < ranks_.size(); ++i) s += (i > 0 ? ", " : "") + std::to_string(ranks_[i]);
    return s + "]";
  }

 private:
  int index_in_range(int i, const char* what) const {
    if (i < 0 || i >= size()) {
      throw error(errc::invalid_argument, std::string("rank_list::") + what + ": position " + std::to_string(i) +
                                              " is outside a group of " + std::to_string(size()));
    }
    return i;
  }
  int at(int i, const char* what) const { return ranks_[static_cast<std::size_t>(index_in_range(i, what))]; }

  std::vector<int> ranks_;
};

/// The members of `a`, then those of `b` not in `a` (MPI_Group_union).
inline rank_list union_of(const rank_list& a, const rank_list& b) {
  std::vector<int> r(a.ranks().begin(), a.ranks().end());
  for (int w : b.ranks()) {
    if (!a.contains(w)) r.push_back(w);
  }
  return rank_list(std::move(r));
}

/// The members of `a` that are also in `b`, in `a`'s order (MPI_Group_intersection).
inline rank_list intersection_of(const rank_list& a, const rank_list& b) {
  std::vector<int> r;
  for (int w : a.ranks()) {
    if (b.contains(w)) r.push_back(w);
  }
  return rank_list(std::move(r));
}

/// The members of `a` not in `b`, in `a`'s order (MPI_Group_difference).
inline rank_list difference_of(const rank_list& a, const rank_list& b) {
  std::vector<int> r;
  for (int w : a.ranks()) {
    if (!b.contains(w)) r.push_back(w);
  }
  return rank_list(std::move(r));
}

}  // namespace dtrain
