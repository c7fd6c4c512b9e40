#pragma once
/// @file
/// `group_request<BaseRequest>`: the completion handle of a send or receive on a
/// `process_group`. It is the world transport's handle, seen from the group: its envelope names
/// the peer by group rank and the tag in the group's own tag space, and its errors name the
/// group, the group rank and the world rank.

#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "dtrain/concepts/completion.hpp"
#include "dtrain/core/deadline.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/detail/request_error.hpp"
#include "dtrain/transport/rank_list.hpp"

namespace dtrain {

/// Who is in a process group and how it is told apart from the others on the same world
/// transport. Shared by every copy of the group and every request on it.
struct group_layout {
  std::string name;    ///< "world", or how the group was formed, for messages
  rank_list members;   ///< world ranks in group order
  std::uint64_t key;   ///< XORed into every tag: the group's own tag space (0 for the world)
  std::vector<int> of_world;  ///< world rank -> group rank, -1 outside the group

  group_layout(std::string n, rank_list m, std::uint64_t k, int world_size)
      : name(std::move(n)), members(std::move(m)), key(k), of_world(static_cast<std::size_t>(world_size), -1) {
    for (int g = 0; g < members.size(); ++g) of_world.at(static_cast<std::size_t>(members[g])) = g;
  }

  /// "rank 2 of group 'dp' (world rank 6)"; the world's ranks are just "rank 6".
  std::string describe_rank(int group_rank) const {
    if (key == 0 && name == "world") return "rank " + std::to_string(group_rank);
    const std::string world =
        group_rank >= 0 && group_rank < members.size() ? std::to_string(members[group_rank]) : "?";
    return "rank " + std::to_string(group_rank) + " of group '" + name + "' (world rank " + world + ")";
  }
};

template <completion BaseRequest>
class group_request {
 public:
  group_request() = default;
  group_request(BaseRequest r, std::shared_ptr<const group_layout> layout, int peer, bool is_send)
      : base_(std::move(r)), layout_(std::move(layout)), peer_(peer), is_send_(is_send) {}

  bool wait(deadline d, std::error_code& ec) noexcept { return base_.wait(d, ec); }

  /// @throws dtrain::error naming the operation, the group, the peer's group and world ranks.
  void wait(deadline d) {
    std::error_code ec;
    if (wait(d, ec)) return;
    std::string why;
    if constexpr (requires { base_.detail(); }) why = base_.detail();
    envelope e = info();
    if (e.peer == any_peer) e.peer = peer_;
    std::string text = detail::request_error_text(is_send_, e, why);
    if (layout_)
      text += " [" + (e.peer == any_peer ? "group '" + layout_->name + "'" : layout_->describe_rank(e.peer)) + "]";
    throw error(ec, text);
  }

  bool test() noexcept { return base_.test(); }
  void cancel() noexcept { base_.cancel(); }

  /// The envelope, with the peer as a group rank and the tag as the group's caller gave it.
  const envelope& info() const noexcept {
    envelope_ = base_.info();
    if (layout_) {
      envelope_.tag ^= layout_->key;
      if (envelope_.peer >= 0 && static_cast<std::size_t>(envelope_.peer) < layout_->of_world.size()) {
        envelope_.peer = layout_->of_world[static_cast<std::size_t>(envelope_.peer)];
      }
    }
    return envelope_;
  }

  /// What the world transport knows of a failure (which peer was lost and how), if it says.
  std::string detail() const {
    if constexpr (requires { base_.detail(); }) {
      return std::string(base_.detail());
    } else {
      return {};
    }
  }

 private:
  BaseRequest base_;
  std::shared_ptr<const group_layout> layout_;
  int peer_ = any_peer;  // as the caller named it (a group rank or any_peer)
  bool is_send_ = false;
  mutable envelope envelope_;
};

}  // namespace dtrain
