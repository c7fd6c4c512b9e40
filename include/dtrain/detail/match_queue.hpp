#pragma once
// MPI's matching rule, written once for every transport that matches messages itself (inproc,
// TCP): a receive posted for (peer, tag), where peer may be any_peer, takes the first message from
// that peer on that tag; messages that arrive before their receive wait, in arrival order, for
// one. Both sides keep arrival order, so messages between two ranks on one tag are received in
// the order they were sent.

#include <algorithm>
#include <cstdint>
#include <deque>
#include <iterator>
#include <utility>
#include <vector>

#include "dtrain/concepts/transport.hpp"

namespace dtrain::detail {

/// What a receive asks for, or what a message came with.
struct match_key {
  int peer = 0;  ///< the sender (any_peer in a receive: any sender)
  std::uint64_t tag = 0;
};

/// Whether a receive that wants `want` takes a message that came with `got`.
constexpr bool takes(match_key want, match_key got) noexcept {
  return want.tag == got.tag && (want.peer == any_peer || want.peer == got.peer);
}

/// The posted receives and the waiting (unexpected) messages of one endpoint. `Receive` and
/// `Message` are handles (shared pointers, say); `Keys::of_receive(r)` and `Keys::of_message(m)`
/// give their keys. Where a receive may be posted in two transports at once (an any-peer
/// receive of the mixed transport), `Keys::claim(r)` says whether this one may take a message
/// (and claims it), and `Keys::drop(r)` finishes one the other transport took. Not thread-safe: the transport's lock
/// guards it, and the transport decides what matching means for its operations' state (this only finds and removes).
template <class Receive, class Message, class Keys>
class match_queue {
 public:
  /// The first waiting message that a receive wanting `want` takes, removed; empty if none.
  Message take_message(match_key want) {
    return take_first(messages_, [&](const Message& m) { return takes(want, Keys::of_message(m)); });
  }
  /// The first waiting message that a receive wanting `want` takes, left in place; empty if none.
  Message find_message(match_key want) const {
    auto it = std::find_if(messages_.begin(), messages_.end(),
                           [&](const Message& m) { return takes(want, Keys::of_message(m)); });
    return it == messages_.end() ? Message{} : *it;
  }
  /// The first posted receive that takes a message that came with `got`, removed; empty if none.
  /// A receive shared with another transport (see `Keys::claim`) that the other has already
  /// served is dropped (`Keys::drop`) on the way.
  Receive take_receive(match_key got) {
    for (;;) {
      Receive r = take_first(receives_, [&](const Receive& c) { return takes(Keys::of_receive(c), got); });
      if constexpr (requires { Keys::claim(r); }) {
        if (r && !Keys::claim(r)) {
          Keys::drop(r);
          continue;
        }
      }
      return r;
    }
  }

  /// Whether a receive is posted for a message from `peer` (or from any peer).
  bool has_receive_from(int peer) const {
    return std::any_of(receives_.begin(), receives_.end(), [&](const Receive& r) {
      const int want = Keys::of_receive(r).peer;
      return want == peer || want == any_peer;
    });
  }
  bool has_receives() const noexcept { return !receives_.empty(); }

  void post(Receive r) { receives_.push_back(std::move(r)); }
  void hold(Message m) { messages_.push_back(std::move(m)); }

  /// Removes a posted receive (a cancel); @returns whether it was still posted.
  bool withdraw_receive(const Receive& r) { return std::erase(receives_, r) > 0; }
  /// Removes a waiting message; @returns whether it was still waiting.
  bool withdraw_message(const Message& m) { return std::erase(messages_, m) > 0; }

  /// Removes and returns, in order, the receives posted for a message from `peer` (not those for
  /// any peer): what a peer that has left can no longer satisfy.
  std::vector<Receive> take_receives_from(int peer) {
    return take_all_if(receives_, [&](const Receive& r) { return Keys::of_receive(r).peer == peer; });
  }
  /// Removes and returns every posted receive, in order.
  std::vector<Receive> take_all_receives() { return take_all(receives_); }
  /// Removes and returns every waiting message, in order.
  std::vector<Message> take_all_messages() { return take_all(messages_); }
  /// Removes and returns, in order, the waiting messages for which `pred` holds.
  template <class Pred>
  std::vector<Message> take_messages_if(Pred pred) {
    return take_all_if(messages_, pred);
  }

 private:
  template <class Handle, class Pred>
  static Handle take_first(std::deque<Handle>& from, Pred pred) {
    auto it = std::find_if(from.begin(), from.end(), pred);
    if (it == from.end()) return Handle{};
    Handle h = std::move(*it);
    from.erase(it);
    return h;
  }
  template <class Handle>
  static std::vector<Handle> take_all(std::deque<Handle>& from) {
    std::vector<Handle> taken(std::make_move_iterator(from.begin()), std::make_move_iterator(from.end()));
    from.clear();
    return taken;
  }
  template <class Handle, class Pred>
  static std::vector<Handle> take_all_if(std::deque<Handle>& from, Pred pred) {
    std::vector<Handle> taken;
    auto keep = std::stable_partition(from.begin(), from.end(), [&](const Handle& h) { return !pred(h); });
    std::move(keep, from.end(), std::back_inserter(taken));
    from.erase(keep, from.end());
    return taken;
  }

  std::deque<Receive> receives_;
  std::deque<Message> messages_;
};

}  // namespace dtrain::detail
