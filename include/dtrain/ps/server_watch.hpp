#pragma once
/// @file
/// `ps::server_watch`: how one server learns that another is lost. It keeps a receive posted
/// from every other server on a tag nobody sends on; the receive fails when that server's
/// connection ends, and `lost()` reports it once. The server (ps/server.hpp) then closes the
/// chains over it (ps/server_membership.hpp).

#include <chrono>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "dtrain/concepts/transport.hpp"
#include "dtrain/core/deadline.hpp"
#include "dtrain/ps/server_context.hpp"

namespace dtrain::ps {

template <transport Transport>
class server_watch {
 public:
  /// Who was found lost, and the transport's words for why.
  struct loss {
    int server;
    std::string why;
  };

  explicit server_watch(server_context<Transport>& ctx) : ctx_(&ctx) {}

  /// Posts the watches: one receive from every other server not already lost.
  void start() {
    const int size = ctx_->group.size();
    watches_.resize(static_cast<std::size_t>(size));
    for (int s = 0; s < size; ++s) {
      if (s != ctx_->me() && ctx_->group.is_server(s) && !ctx_->layout.lost(s)) {
        watches_[static_cast<std::size_t>(s)].emplace(
            ctx_->transport.irecv(s, ctx_->options.tag - 1, std::span<std::byte>{}));
      }
    }
  }

  /// The servers lost since the last call, each reported once.
  std::vector<loss> lost() {
    std::vector<loss> found;
    for (std::size_t s = 0; s < watches_.size(); ++s) {
      auto& w = watches_[s];
      if (!w || !w->test()) continue;
      std::error_code ec;
      w->wait(deadline::after(std::chrono::milliseconds(0)), ec);
      w.reset();
      found.push_back({static_cast<int>(s), ec.message()});
    }
    return found;
  }

  /// Withdraws every watch (the server stops).
  void cancel() {
    for (auto& w : watches_) {
      if (w) w->cancel();
    }
  }

 private:
  using handle = decltype(std::declval<Transport&>().irecv(0, 0, std::span<std::byte>{}));

  server_context<Transport>* ctx_;
  std::vector<std::optional<handle>> watches_;  // by rank; empty for workers, itself, the lost
};

}  // namespace dtrain::ps
