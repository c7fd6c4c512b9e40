#pragma once
/// @file
/// `ps::replacements`: which standby server takes whose place, as one server sees it. Standby i
/// takes the place of the i-th server lost, in the order this server saw the losses; a server
/// that leaves cleanly hands its place first to the standby that would take it were it lost
/// (the next in that order), so that the order of replacements stays the order of losses on
/// every process. This file decides; ps/server.hpp sends the messages and logs.

#include <algorithm>
#include <chrono>
#include <optional>
#include <set>
#include <vector>

#include "dtrain/ps/chain.hpp"
#include "dtrain/ps/roles.hpp"

namespace dtrain::ps {

class replacements {
 public:
  using clock = std::chrono::steady_clock;

  replacements(roles group, int me) : group_(group), me_(me) {}

  /// Server `rank` is lost (a standby lost is no server's replacement to count).
  void lost(int rank) {
    if (!group_.is_standby(rank)) losses_.push_back(rank);
  }

  // --- on a standby -------------------------------------------------------------------------

  /// The lost server whose place this standby should take now: its turn has come and it takes
  /// no one's place yet.
  std::optional<int> due() const {
    if (!group_.is_standby(me_) || replacing_ >= 0) return std::nullopt;
    const auto index = static_cast<std::size_t>(me_ - group_.standby_rank(0));
    if (losses_.size() <= index) return std::nullopt;
    return losses_[index];
  }

  /// Takes server `s`'s place (lost, or handing it over): every shard of `s` that `holds` says
  /// this server has no copy of is to be joined. @returns false if this server is no standby, or
  /// takes another's place already (`replacing()` says whose)
  template <class Holds>
  bool take_place_of(int s, const chain_layout& layout, Holds&& holds) {
    if (!group_.is_standby(me_) || replacing_ >= 0) return false;
    replacing_ = s;
    for (int shard : layout.held_by(s)) {
      if (!holds(shard)) joining_.insert(shard);
    }
    return true;
  }

  int replacing() const noexcept { return replacing_; }

  /// A growing server joins every shard it grows into (`roles::grows_into`) and holds no copy
  /// of. @returns whether there is one
  bool grow(const chain_layout& layout) {
    for (int s = 0; s < layout.shards(); ++s) {
      if (group_.grows_into(s) == me_ && layout.position(s, me_) < 0) joining_.insert(s);
    }
    return !joining_.empty();
  }

  /// The shards this standby asks to join, their state not here yet; those whose every copy is
  /// lost are given up first.
  const std::set<int>& to_join(const chain_layout& layout) {
    std::erase_if(joining_, [&](int s) { return layout.head(s) < 0; });
    return joining_;
  }
  bool joins(int shard) const { return joining_.count(shard) != 0; }
  /// The state of `shard` arrived. @returns false if this server did not ask to join it
  bool joined(int shard) { return joining_.erase(shard) != 0; }
  bool joining() const noexcept { return !joining_.empty(); }
  std::size_t still_to_join() const noexcept { return joining_.size(); }

  // --- on a server leaving ------------------------------------------------------------------

  /// Whether this server, leaving, has chosen whom to hand its place to (or that nobody can
  /// take it).
  bool handing_over() const noexcept { return handed_to_ != not_yet; }

  /// Chooses the standby to hand this server's place to, now: @returns its rank, or nothing
  /// when this is a standby or none is left.
  std::optional<int> hand_over(const chain_layout& layout) {
    handed_to_ = nobody;
    const auto next = static_cast<int>(losses_.size());
    if (group_.is_standby(me_) || next >= group_.standby || layout.lost(group_.standby_rank(next))) return std::nullopt;
    handed_to_ = group_.standby_rank(next);
    handed_at_ = clock::now();
    return handed_to_;
  }

  /// Whether the standby this server handed its place to is in every chain of `shards` (or is
  /// lost, or did not come within `timeout`), so that this server may go.
  bool handed_over(const chain_layout& layout, const std::vector<int>& shards,
                   std::chrono::milliseconds timeout) const {
    if (handed_to_ < 0 || layout.lost(handed_to_) || clock::now() - handed_at_ > timeout) return true;
    // A standby is never a static member: holding a copy means it joined.
    return std::all_of(shards.begin(), shards.end(), [&](int s) { return layout.position(s, handed_to_) >= 0; });
  }

 private:
  static constexpr int not_yet = -2, nobody = -1;

  roles group_;
  int me_;
  std::vector<int> losses_;  // the servers lost, in the order this server saw them
  int replacing_ = -1;       // the server whose place this standby takes
  std::set<int> joining_;    // shards this standby asks to join, their state not yet here
  int handed_to_ = not_yet;  // the standby this server, leaving, handed its place to
  clock::time_point handed_at_;
};

}  // namespace dtrain::ps
