#pragma once
/// @file
/// `process_group<World>`: a group of ranks of a world transport, itself a `transport`, so every
/// collective, algorithm and trainer runs on a sub-group unchanged (MPI communicators, PyTorch's
/// `new_group`, NCCL's `ncclCommSplit`).
///
/// <!-- frame: function_asio -->
/// @code
/// dtrain::process_group world(dtrain::tcp_transport::from_environment());
/// auto row = world.split(world.rank() / 4);            // collective: ranks 0-3, 4-7, ...
/// dtrain::ring<dtrain::process_group<dtrain::tcp_transport>> c(*row);
/// c.allreduce(std::span(grads), dtrain::reduce_op::avg);  // over the row only
/// @endcode
///
/// - Every group shares the world transport's connections: a group is a rank map and a tag space,
///   never new sockets. Its ranks are 0..size()-1 in group order.
/// - Each group has its own tag space: every tag is XORed with the group's 64-bit key (0 for the
///   world itself), so collectives on different groups, also at once on different threads, never
///   receive each other's messages; each communicator over a group keeps its own sequence.
/// - `split(color, key)` is collective over the group (MPI_Comm_split): ranks of one color form a
///   group, ordered by key then by their rank here; `no_group` leaves a rank out. Every rank
///   computes the same keys from the same exchange.
/// - `form(list)` is local: every member calls it with the same `rank_list` (built with
///   rank_list's incl, excl and set operations) and name; the key comes from both, so two groups
///   of the same members used at once need different names.

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dtrain/concepts/transport.hpp"
#include "dtrain/core/deadline.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/hash.hpp"
#include "dtrain/core/signature.hpp"
#include "dtrain/transport/buffer_forms.hpp"
#include "dtrain/transport/group_request.hpp"
#include "dtrain/transport/progress.hpp"
#include "dtrain/transport/rank_list.hpp"

namespace dtrain {

/// The color that leaves a rank out of every group of a `split` (MPI_UNDEFINED).
inline constexpr int no_group = -1;

template <transport World>
class process_group : public transport_buffer_forms<process_group<World>> {
 public:
  using transport_buffer_forms<process_group>::irecv;
  using transport_buffer_forms<process_group>::isend;
  using memory_space = typename World::memory_space;
  using request = group_request<typename World::request>;
  static constexpr std::size_t reduce_piece_bytes = reduce_piece_bytes_of<World>;  // the world's

  /// The whole of `world`'s group, which it takes over; every group formed from it shares it.
  /// `timeout` bounds `split`'s exchange.
  explicit process_group(World world, std::chrono::milliseconds timeout = std::chrono::seconds(60))
      : world_(std::make_shared<World>(std::move(world))), timeout_(timeout) {
    layout_ = std::make_shared<const group_layout>("world", rank_list::range(0, world_->size()), 0, world_->size());
    rank_ = world_->rank();
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return layout_->members.size(); }

  /// Fails the world's group, telling every rank `why`, where the world's transport can
  /// (`engine_handle::abort`); every group formed from the world shares it, so all of them fail.
  void abort(const std::string& why, errc code = errc::peer_lost) noexcept
    requires requires(World& w) { w.abort(why, code); }
  {
    world_->abort(why, code);
  }

  /// Starts sending the bytes of `parts` to group rank `peer` on `tag` (in this group's tags).
  request isend(int peer, std::uint64_t tag, const signature& sig, gather_list parts) {
    DTRAIN_ASSERT(peer >= 0 && peer < size(), "send to a rank outside the group");
    return {world_->isend(layout_->members[peer], tag ^ layout_->key, sig, parts), layout_, peer, true};
  }

  /// Starts receiving from group rank `peer` (or `any_peer`: a member of this group) on `tag`.
  request irecv(int peer, std::uint64_t tag, scatter_list parts, std::vector<std::byte>* overflow) {
    DTRAIN_ASSERT(peer == any_peer || (peer >= 0 && peer < size()), "receive from a rank outside the group");
    const int from = peer == any_peer ? any_peer : layout_->members[peer];
    return {world_->irecv(from, tag ^ layout_->key, parts, overflow), layout_, peer, false};
  }

  /// "world", or how the group was formed ("world/split0:color3", a `form` name).
  const std::string& name() const noexcept { return layout_->name; }
  /// The world ranks of the members, in group order.
  const rank_list& members() const noexcept { return layout_->members; }
  /// The world rank of group rank `r` (by default this rank's).
  int world_rank(int r) const { return layout_->members[r]; }
  int world_rank() const noexcept { return world_->rank(); }
  int world_size() const noexcept { return world_->size(); }
  /// The world transport's `spare_cores()` (progress.hpp): this host's cores against the world's
  /// ranks on it.
  bool spare_cores() const noexcept { return spare_cores_of(*world_); }
  /// What is XORed into this group's tags (0 for the world).
  std::uint64_t key() const noexcept { return layout_->key; }
  /// "rank 2 of group 'dp' (world rank 6)": how errors name a member.
  std::string describe_rank(int r) const { return layout_->describe_rank(r); }

  /// MPI_Comm_split. Collective over this group: every member calls it, in the same order
  /// relative to its other splits. @returns the group of this rank's color, ordered by `order`
  ///   then by rank here; empty for `no_group`.
  /// @throws dtrain::error `invalid_argument` for a negative color other than `no_group`;
  ///   `timeout` naming the members that did not take part; the transport's errors.
  std::optional<process_group> split(int color, int order = 0) {
    return split(color, order, deadline::after(timeout_));
  }

  std::optional<process_group> split(int color, int order, deadline d) {
    if (color < 0 && color != no_group) {
      throw error(errc::invalid_argument, "process_group::split: color " + std::to_string(color) +
                                              " is negative (no_group, -1, leaves a rank out)");
    }
    const std::uint64_t round = (*rounds_)++;
    const std::vector<std::int64_t> all = exchange({color, order}, setup_tag + round, d, "process_group::split");
    if (color == no_group) return std::nullopt;
    // Members of this color, by (order, rank here): MPI's order.
    std::vector<std::pair<std::int64_t, int>> mine;
    for (int r = 0; r < size(); ++r) {
      if (all[2 * static_cast<std::size_t>(r)] == color) mine.emplace_back(all[2 * static_cast<std::size_t>(r) + 1], r);
    }
    std::stable_sort(mine.begin(), mine.end());
    std::vector<int> world;
    for (const auto& [o, r] : mine) world.push_back(layout_->members[r]);
    const std::string label = layout_->name + "/split" + std::to_string(round) + ":color" + std::to_string(color);
    const std::uint64_t group_key =
        mix(fnv1a().word(layout_->key).text("split").word(round).word(static_cast<std::uint64_t>(color)));
    return process_group(*this, label, rank_list(std::move(world)), group_key);
  }

  /// The group of `list`'s world ranks, in its order, named `name`. Local: every member calls it
  /// with the same list and name. @returns empty if this rank is not in `list`.
  /// @throws dtrain::error `invalid_argument` if `list` names a rank outside the world.
  std::optional<process_group> form(const rank_list& list, std::string_view label) const {
    for (int w : list.ranks()) {
      if (w >= world_->size()) {
        throw error(errc::invalid_argument, "process_group::form: " + list.text() + " names rank " + std::to_string(w) +
                                                " outside a world of " + std::to_string(world_->size()));
      }
    }
    if (!list.contains(world_->rank())) return std::nullopt;
    fnv1a h;
    h.text("form").text(label);
    for (int w : list.ranks()) h.word(static_cast<std::uint64_t>(w));
    return process_group(*this, std::string(label), list, mix(h));
  }

  /// Every member's two values, in group order (2 per rank): a direct exchange, P - 1 messages
  /// per rank, for set-up (split, host discovery), not for data. Collective over the group,
  /// under the group's timeout; `what` names the caller in errors.
  std::vector<std::int64_t> exchange_setup_values(std::array<std::int64_t, 2> mine, std::string_view what) {
    return exchange(mine, setup_tag + (*rounds_)++, deadline::after(timeout_), what);
  }

 private:
  std::vector<std::int64_t> exchange(std::array<std::int64_t, 2> mine, std::uint64_t tag, deadline d,
                                     std::string_view what) {
    const auto n = static_cast<std::size_t>(size());
    std::vector<std::int64_t> all(2 * n);
    std::memcpy(&all[2 * static_cast<std::size_t>(rank_)], mine.data(), sizeof mine);
    std::vector<request> receives, sends;
    for (int r = 0; r < size(); ++r) {
      if (r == rank_) continue;
      receives.push_back(
          this->irecv(r, tag, std::as_writable_bytes(std::span(&all[2 * static_cast<std::size_t>(r)], 2))));
    }
    for (int r = 0; r < size(); ++r) {
      if (r != rank_) sends.push_back(this->isend(r, tag, signature{}, std::as_bytes(std::span(mine))));
    }
    try {
      for (auto& q : receives) q.wait(d);
      for (auto& q : sends) q.wait(d);
    } catch (const error& e) {
      const std::string where = std::string(what) + " on " + describe_rank(rank_) + ": ";
      if (e.code() == errc::timeout) {  // name every member whose values never came, not a tag
        std::string missing;
        for (std::size_t i = 0, r = 0; r < n; ++r) {
          if (static_cast<int>(r) == rank_) continue;
          if (!receives[i++].test()) missing += (missing.empty() ? "" : ", ") + describe_rank(static_cast<int>(r));
        }
        if (!missing.empty()) {
          throw error(errc::timeout, where + missing + " did not take part by the deadline (every member must call " +
                                         std::string(what) + ", in the same order as its other set-up calls)");
        }
      }
      throw error(e.code(), where + e.reason());
    }
    return all;
  }

  // Tags of set-up exchanges, in the group's own space: "setup" and a round number.
  static constexpr std::uint64_t setup_tag = 0x7365747570000000;

  process_group(const process_group& parent, std::string label, rank_list list, std::uint64_t group_key)
      : world_(parent.world_), timeout_(parent.timeout_) {
    layout_ = std::make_shared<const group_layout>(std::move(label), std::move(list), group_key == 0 ? 1 : group_key,
                                                   world_->size());
    rank_ = layout_->of_world[static_cast<std::size_t>(world_->rank())];
  }

  // FNV-1a, finished with splitmix64's mixer so that every bit of the key depends on every input.
  static std::uint64_t mix(const fnv1a& h) noexcept {
    std::uint64_t z = h.value() + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

  std::shared_ptr<World> world_;
  std::shared_ptr<const group_layout> layout_;
  // Set-up exchanges (splits among them) so far: they number the tags and split's keys.
  std::shared_ptr<std::atomic<std::uint64_t>> rounds_ = std::make_shared<std::atomic<std::uint64_t>>(0);
  std::chrono::milliseconds timeout_;
  int rank_ = 0;
};

}  // namespace dtrain
