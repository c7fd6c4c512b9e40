#pragma once
/// @file
/// Point-to-point messages in the flight recorder. A `p2p_log` is one endpoint's record of its
/// messages: their group, and per peer, tag and direction how many it has posted, since the k-th
/// send from one rank to another on a tag meets the k-th receive there. `recorded<Request>` is a
/// send or receive (any `completion`) with its record: started when posted, waiting on its peer
/// once waited for, then completed or failed. One waited for in vain (the wait timed out, and
/// the operation was then given up) stays waiting: that is what a hang's analysis looks for.
///
/// A message's record reads as a call of operation `message`: `tag` is the message's tag, `seq`
/// its k, `peer` the other rank's world rank, `dir` send or recv; its type and count are the
/// message's (a receive's: what it expects).

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include "dtrain/concepts/completion.hpp"
#include "dtrain/core/deadline.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/signature.hpp"
#include "dtrain/flight/dump.hpp"
#include "dtrain/flight/recorder.hpp"

namespace dtrain::flight {

/// A send or a receive with its flight record (itself a `completion`).
template <completion Request>
class recorded {
 public:
  recorded() = default;
  recorded(Request r, recorder::handle h, int peer, bool sending)
      : r_(std::move(r)), h_(h), peer_(peer), sending_(sending), open_(true) {}
  recorded(recorded&& o) noexcept
      : r_(std::move(o.r_)),
        h_(o.h_),
        peer_(o.peer_),
        sending_(o.sending_),
        open_(std::exchange(o.open_, false)),
        waited_out_(o.waited_out_) {}
  /// Moving onto an unfinished one cancels it, as the request's own move does.
  recorded& operator=(recorded&& o) noexcept {
    if (this == &o) return *this;
    cancel();
    r_ = std::move(o.r_);
    h_ = o.h_, peer_ = o.peer_, sending_ = o.sending_, waited_out_ = o.waited_out_;
    open_ = std::exchange(o.open_, false);
    return *this;
  }
  ~recorded() { cancel(); }

  bool wait(deadline d, std::error_code& ec) noexcept {
    if (open_) h_.waiting(peer_, sending_);
    const bool ok = r_.wait(d, ec);
    settle(ok, ec);
    return ok;
  }
  void wait(deadline d) {
    if (open_) h_.waiting(peer_, sending_);
    try {
      r_.wait(d);
    } catch (const error& e) {
      if (e.code() == errc::timeout) {
        waited_out_ = true;
      } else if (open_) {
        h_.failed(recorder::intern(e.what()));
        open_ = false;
      }
      throw;
    }
    settle(true, {});
  }
  bool test() noexcept {
    if (!r_.test()) return false;
    learn_result();
    return true;
  }
  /// A message waited for in vain and then given up stays recorded as waiting: what a hang's
  /// analysis looks for.
  void cancel() noexcept {
    if (!open_) return;
    r_.cancel();
    learn_result();  // a message that had already landed completes
  }
  const envelope& info() const noexcept { return r_.info(); }

 private:
  void learn_result() noexcept {
    if (!open_) return;
    std::error_code ec;
    settle(r_.wait(deadline::after(std::chrono::milliseconds(0)), ec), ec);
  }
  // A wait that timed out leaves the operation pending and its record waiting; so does one
  // cancelled after that.
  void settle(bool ok, std::error_code ec) noexcept {
    if (!open_) return;
    if (ok) {
      h_.completed();
    } else if (ec == errc::timeout) {
      waited_out_ = true;
      return;
    } else if (waited_out_ && ec == errc::cancelled) {
      open_ = false;
      return;
    } else {
      try {
        h_.failed(recorder::intern(ec.message()));
      } catch (...) {
        h_.failed("failed");
      }
    }
    open_ = false;
  }

  Request r_{};
  recorder::handle h_{};
  int peer_ = -1;
  bool sending_ = false, open_ = false, waited_out_ = false;
};

/// One endpoint's record of its messages. Thread-safe; movable.
class p2p_log {
 public:
  p2p_log() = default;
  /// `group`: the group's name and this rank's place (from `group_of`); `members`: the world rank
  /// of each group rank (empty: the same numbers).
  /// Sets the process up for dumps (DTRAIN_FLIGHT_DIR), as a communicator does.
  explicit p2p_log(recorder::group_info group, std::vector<int> members = {})
      : state_(std::make_unique<state>(group, std::move(members))) {
    dumper::global().set_rank(group.world_rank);
  }

  /// `r`, a send (`sending`) to or a receive from group rank `peer` on `tag` of `sig`'s type and
  /// count, with its record started.
  template <completion Request>
  recorded<Request> post(Request r, int peer, std::uint64_t tag, bool sending, signature sig) {
    if (!state_ || !recorder::global().enabled()) return {std::move(r), {}, peer, sending};
    const int world = peer >= 0 && static_cast<std::size_t>(peer) < state_->members.size()
                          ? state_->members[static_cast<std::size_t>(peer)]
                          : peer;
    std::uint64_t k = 0;
    {
      std::lock_guard lock(state_->m);
      k = ++state_->posted[{world, tag, sending}];
    }
    recorder::group_info g = state_->group;
    g.tag = tag;
    sig.op = coll_op::message, sig.algo = algorithm::automatic, sig.seq = k, sig.root = 0;
    return {std::move(r), recorder::global().start(g, sig, world, sending), world, sending};
  }

 private:
  struct state {
    state(recorder::group_info g, std::vector<int> world) : group(g), members(std::move(world)) {}
    recorder::group_info group;
    std::vector<int> members;
    std::mutex m;
    std::map<std::tuple<int, std::uint64_t, bool>, std::uint64_t> posted;  // (peer, tag, send) -> k
  };
  std::unique_ptr<state> state_;
};

/// The world ranks of `t`'s members: a process group's, or 0 .. size - 1.
template <class Transport>
std::vector<int> members_of(const Transport& t) {
  std::vector<int> out;
  if constexpr (requires { t.world_rank(0); }) {
    for (int r = 0; r < t.size(); ++r) out.push_back(t.world_rank(r));
  }
  return out;
}

}  // namespace dtrain::flight
