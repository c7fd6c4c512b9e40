#pragma once
/// @file
/// Point-to-point messages in the flight recorder. A `p2p_log` is one endpoint's record of its
/// messages: their group, and per peer, tag and direction (a channel) how many it has posted,
/// since the k-th send from one rank to another on a tag meets the k-th receive there.
/// `recorded<Request>` is a send or receive (any `completion`) with its record: started when
/// posted, waiting on its peer once waited for, then completed or failed. One waited for in vain
/// (the wait timed out, and the operation was then given up) stays waiting: that is what a hang's
/// analysis looks for. A message cancelled before it matched is withdrawn and gives its number
/// back: the channel's later messages, all unmatched too (messages match in posting order), move
/// one down, so that numbers keep pairing sends with receives.
///
/// A message's record reads as a call of operation `message`: `tag` is the message's tag, `seq`
/// its k, `peer` the other rank's world rank, `dir` send or recv; its type and count are the
/// message's (a receive's: what it expects).

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iterator>
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

namespace detail {
/// One endpoint's channels: per (peer, tag, sending) the messages posted and those still open,
/// in posting order. Shared by the log and its messages, which may outlive it.
class p2p_channels {
 public:
  using key = std::tuple<int, std::uint64_t, bool>;

  /// Numbers a new message of channel `k` and starts its record with `start(seq)`.
  template <class Start>
  recorder::handle open(const key& k, Start&& start) {
    std::lock_guard lock(m_);
    channel& c = of_[k];
    c.open.reserve(c.open.size() + 1);  // nothing throws once the record is started
    const recorder::handle h = start(++c.posted);
    if (h.id() != 0) c.open.push_back({h, c.posted});
    return h;
  }

  /// The message of `h` is settled; a withdrawn one gives its number back.
  void close(const key& k, const recorder::handle& h, bool withdrawn) noexcept {
    std::lock_guard lock(m_);
    const auto at = of_.find(k);
    if (at == of_.end()) return;
    channel& c = at->second;
    const auto it = std::find_if(c.open.begin(), c.open.end(), [&](const auto& o) { return o.first.id() == h.id(); });
    if (it == c.open.end()) return;
    if (withdrawn) {
      for (auto later = std::next(it); later != c.open.end(); ++later) later->first.renumber(--later->second);
      --c.posted;
    }
    c.open.erase(it);
  }

 private:
  struct channel {
    std::uint64_t posted = 0;
    std::vector<std::pair<recorder::handle, std::uint64_t>> open;  // unsettled: handle, number
  };
  std::mutex m_;
  std::map<key, channel> of_;
};
}  // namespace detail

/// A send or a receive with its flight record (itself a `completion`).
template <completion Request>
class recorded {
 public:
  recorded() = default;
  /// `key`: the message's channel (its peer's world rank, tag, whether sending); `channels`:
  /// where its number is kept (none: numbers never given back).
  recorded(Request r, recorder::handle h, detail::p2p_channels::key key,
           std::shared_ptr<detail::p2p_channels> channels = nullptr)
      : r_(std::move(r)), h_(h), key_(key), channels_(std::move(channels)), open_(true) {}
  recorded(recorded&& o) noexcept
      : r_(std::move(o.r_)),
        h_(o.h_),
        key_(o.key_),
        channels_(std::move(o.channels_)),
        open_(std::exchange(o.open_, false)),
        waited_out_(o.waited_out_) {}
  /// Moving onto an unfinished one cancels it, as the request's own move does.
  recorded& operator=(recorded&& o) noexcept {
    if (this == &o) return *this;
    cancel();
    r_ = std::move(o.r_);
    h_ = o.h_, key_ = o.key_, waited_out_ = o.waited_out_;
    channels_ = std::move(o.channels_);
    open_ = std::exchange(o.open_, false);
    return *this;
  }
  ~recorded() { cancel(); }

  bool wait(deadline d, std::error_code& ec) noexcept {
    if (open_) h_.waiting(std::get<0>(key_), std::get<2>(key_));
    const bool ok = r_.wait(d, ec);
    settle(ok, ec);
    return ok;
  }
  void wait(deadline d) {
    if (open_) h_.waiting(std::get<0>(key_), std::get<2>(key_));
    try {
      r_.wait(d);
    } catch (const error& e) {
      if (e.code() == errc::timeout) {
        waited_out_ = true;
      } else if (open_) {
        h_.failed(recorder::intern(e.what()));
        close(false);
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
    withdrawing_ = true;  // a cancelled result now means this withdrawal, not a failed group
    learn_result();       // a message that had already landed completes
    if (open_) close(false);  // still moving: it finishes unrecorded, and its channel forgets it
  }
  const envelope& info() const noexcept { return r_.info(); }
  /// What the transport said of a failure (which rank was lost, or why the group was aborted).
  std::string detail() const
    requires requires(const Request& r) { r.detail(); }
  {
    return std::string(r_.detail());
  }

 private:
  void learn_result() noexcept {
    if (!open_) return;
    std::error_code ec;
    settle(r_.wait(deadline::after(std::chrono::milliseconds(0)), ec), ec);
  }
  // A wait that timed out leaves the operation pending and its record waiting; so does one
  // cancelled after that, though its number goes to the next message of its channel. Only
  // `cancel` withdraws: a group that fails (or stops) cancels its operations too, and those failed.
  void settle(bool ok, std::error_code ec) noexcept {
    if (!open_) return;
    if (ok) {
      h_.completed();
    } else if (ec == errc::timeout) {
      waited_out_ = true;
      return;
    } else if (ec == errc::cancelled && withdrawing_) {
      if (!waited_out_) h_.withdrawn();
    } else {
      try {
        h_.failed(recorder::intern(ec.message()));
      } catch (...) {
        h_.failed("failed");
      }
    }
    close(ec == errc::cancelled && withdrawing_);
  }
  void close(bool withdrawn) noexcept {
    open_ = false;
    if (channels_) channels_->close(key_, h_, withdrawn);
  }

  Request r_{};
  recorder::handle h_{};
  detail::p2p_channels::key key_{-1, 0, false};
  std::shared_ptr<detail::p2p_channels> channels_;
  bool open_ = false, waited_out_ = false, withdrawing_ = false;
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
    if (!state_ || !recorder::global().enabled()) return {std::move(r), {}, {peer, tag, sending}};
    const int world = peer >= 0 && static_cast<std::size_t>(peer) < state_->members.size()
                          ? state_->members[static_cast<std::size_t>(peer)]
                          : peer;
    recorder::group_info g = state_->group;
    g.tag = tag;
    sig.op = coll_op::message, sig.algo = algorithm::automatic, sig.root = 0;
    const detail::p2p_channels::key key{world, tag, sending};
    const recorder::handle h = state_->channels->open(key, [&](std::uint64_t k) {
      sig.seq = k;
      return recorder::global().start(g, sig, world, sending);
    });
    return {std::move(r), h, key, state_->channels};
  }

 private:
  struct state {
    state(recorder::group_info g, std::vector<int> world) : group(g), members(std::move(world)) {}
    recorder::group_info group;
    std::vector<int> members;
    std::shared_ptr<detail::p2p_channels> channels = std::make_shared<detail::p2p_channels>();
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
