// torch.distributed.monitored_barrier on dtrain: Gloo's protocol (every rank tells rank 0 it has
// arrived; rank 0 waits for them up to the timeout and then releases them) and Gloo's wording,
// which torch's tests and users' scripts match. One change: rank 0's release carries its verdict
// and goes to every rank, so a rank that arrived, even late, learns at once that the barrier
// failed and who did not come, where under Gloo it waits out the group's timeout and is told to
// read rank 0's log.
#include <ATen/ATen.h>

#include <algorithm>
#include <exception>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "process_group.hpp"

namespace dtrain::torch_backend {
namespace {

// The tag of the n-th monitored barrier's messages: apart from the collectives and from the users'
// sends and receives (process_group.cpp's "tp" tags). A late rank's message for a barrier that
// has failed then never meets a later barrier's receive.
constexpr std::uint64_t barrier_tag(std::uint64_t n) noexcept { return 0x6d62'0000'0000'0000ull + n; }  // "mb"

constexpr std::int64_t all_came = -1;  // rank 0's verdict; otherwise the first rank that did not come

[[noreturn]] void fail(const std::string& text) { std::rethrow_exception(torch_error(text)); }

// What the exception being handled says, without c10's C++ backtrace.
std::string current_failure() {
  try {
    throw;
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  }
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "Rank " : "Ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  return text;
}

}  // namespace

void dtrain_process_group::monitoredBarrier(const ::c10d::BarrierOptions& o, bool waitAllRanks) {
  TORCH_CHECK(comm_.has_value(), "dtrain: monitored_barrier on a group that was shut down");
  const std::chrono::milliseconds timeout = timeout_of(o.timeout);
  const std::uint64_t tag = barrier_tag(monitored_barriers_.fetch_add(1));
  calls_.fetch_add(1);  // one call on every rank, as a barrier
  const int rank = getRank(), size = getSize();
  const std::string ms = std::to_string(timeout.count()) + " ms";
  if (timeout.count() <= 0) {
    fail("[Rank " + std::to_string(rank) + "]: Rank " + std::to_string(rank) + " timed out in monitoredBarrier after " +
         ms + ": no rank has time to arrive");
  }
  if (size == 1) return;
  // One int64 to or from `peer` on the barrier's tag; `value` lives as long as the transfer.
  auto message = [this, tag](bool out, int peer, at::Tensor value, deadline due) {
    const std::span<std::byte> bytes(static_cast<std::byte*>(value.data_ptr()), value.nbytes());
    const std::string what = std::string("monitored_barrier's ") + (out ? "send to" : "recv from") + " rank " +
                             std::to_string(peer);
    return post(
        out ? ::c10d::OpType::SEND : ::c10d::OpType::RECV, {}, host_staging(c10::kCPU, "monitored_barrier"), what, due,
        [this, value, bytes, out, peer, tag] {
          return out ? comm_->transport().isend(peer, tag, signature{}, std::span<const std::byte>(bytes))
                     : comm_->transport().irecv(peer, tag, bytes);
        },
        [bytes, what](point_to_point::request& r) {
          if (r.info().bytes != bytes.size()) {
            throw error(errc::protocol_error, "dtrain: " + what + ": not a barrier's message");
          }
          return r.info().peer;
        });
  };

  if (rank != 0) {
    // Only rank 0's timeout applies: this rank waits at least as long, so that rank 0 speaks first.
    const deadline due = deadline::after(std::max(timeout, timeout_.load()));
    at::Tensor verdict = at::empty({1}, at::kLong);
    auto sent = message(true, 0, at::full({1}, rank, at::kLong), due);
    auto released = message(false, 0, verdict, due);
    const std::string reached = "Rank " + std::to_string(rank) +
                                " successfully reached monitoredBarrier, but received errors while waiting for "
                                "send/recv from rank 0";
    try {
      sent->wait();
      released->wait();
    } catch (...) {
      fail(reached + ": " + current_failure());
    }
    const std::int64_t first_missing = verdict.item<std::int64_t>();
    if (first_missing != all_came) {
      fail(reached + ": rank 0 found that rank " + std::to_string(first_missing) + " did not reach it in " + ms);
    }
    return;
  }

  const deadline due = deadline::after(timeout);
  std::vector<at::Tensor> inbox;
  std::vector<work_ptr> arrivals;
  for (int r = 1; r < size; ++r) {
    inbox.push_back(at::empty({1}, at::kLong));
    arrivals.push_back(message(false, r, inbox.back(), due));
  }
  // Every arrival's receive ends by `due`: in rank order, the first that failed is the first
  // rank that did not come. Without waitAllRanks, the ranks after it are looked at, not waited for.
  std::vector<int> missing, came;
  std::string why;
  for (int r = 1; r < size; ++r) {
    const auto& arrival = arrivals[static_cast<std::size_t>(r - 1)];
    if (!missing.empty() && !waitAllRanks && !arrival->isCompleted()) continue;
    try {
      arrival->wait();
      came.push_back(r);
    } catch (...) {
      missing.push_back(r);
      if (why.empty()) why = current_failure();
    }
  }
  // The verdict goes to every rank: one that comes late still hears it (until the group's
  // timeout), rather than waiting that long for nothing. Only the sends to those that came are
  // waited for.
  at::Tensor verdict = at::full({1}, missing.empty() ? all_came : std::int64_t{missing.front()}, at::kLong);
  std::vector<work_ptr> releases;
  for (int r = 1; r < size; ++r) {
    const bool waited = std::find(came.begin(), came.end(), r) != came.end();
    auto release = message(true, r, verdict, deadline::after(waited ? timeout : std::max(timeout, timeout_.load())));
    if (waited) releases.push_back(std::move(release));
  }
  for (std::size_t i = 0; i < releases.size(); ++i) {
    try {
      releases[i]->wait();
    } catch (...) {
      if (missing.empty()) {
        fail("[Rank 0]: Rank " + std::to_string(came[i]) + " reached monitoredBarrier, but its release failed: " +
             current_failure());
      }
    }
  }
  if (!missing.empty()) {
    if (!waitAllRanks) missing.resize(1);
    fail("[Rank 0]: " + ranks_text(missing) + " failed to pass monitoredBarrier in " + ms + ": " + why);
  }
}

}  // namespace dtrain::torch_backend
