#pragma once
// Gathered sends and scattered receives (the transport concept, items 5 and 6), for any
// transport of two ranks: every combination of gathered or contiguous sends and scattered,
// single or resizing receives, on the path where the receive is posted first and on the one
// where the message arrives first, checked byte for byte against the concatenation of what was
// sent. `check(bool, what)` reports one assertion (the callers' macros are thread-safe).

#include <chrono>
#include <cstddef>
#include <mutex>
#include <cstdint>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#include "dtrain/concepts/transport.hpp"
#include "dtrain/core/deadline.hpp"
#include "dtrain/core/error.hpp"

namespace parts_case {

using namespace std::chrono_literals;

inline std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + seed * 7 + i / 251) % 251);
  return v;
}

// Part sizes: a 48-byte header, an odd middle, an empty range, the rest; a large case crosses
// many socket reads inside one part.
struct shape {
  std::size_t header, middle, rest;
  std::size_t total() const { return header + middle + rest; }
};
inline const shape shapes[] = {{48, 0, 0}, {48, 1, 7}, {48, 1001, 4096}, {48, 333333, (std::size_t{1} << 20) + 5}};

constexpr std::uint64_t data_tag = 61, note_tag = 62;

// Every check of a two-rank run: six receives per shape and order on rank 1, a self-send on each.
inline constexpr int expected_checks = static_cast<int>(std::size(shapes)) * 2 * 6 + 2;

// Collects the checks of both ranks (threads), to be asserted on the test's own thread.
struct tally {
  std::mutex m;
  std::vector<std::string> failed;
  int checks = 0;
  auto checker() {
    return [this](bool ok, const std::string& what) {
      std::lock_guard lock(m);
      ++checks;
      if (!ok) failed.push_back(what);
    };
  }
};

// Posted first: rank 1 posts all six receives, then tells rank 0, which sends the six messages
// back to back, so each is read into its posted buffers while the next is already arriving (a
// reader that took more than a message's bytes would eat the next one's header). Arrived first:
// rank 0 sends the six and a note after them; rank 1 posts its receives once the note is in.
template <class Transport, class Check>
void run(int rank, Transport& t, Check check) {
  const auto d = [] { return dtrain::deadline::after(20s); };
  std::byte note[1] = {std::byte{1}};
  unsigned seed = 0;
  for (const shape& s : shapes) {
    for (bool arrives_first : {false, true}) {
      const auto whole = pattern(s.total(), ++seed);
      const std::span<const std::byte> all(whole);
      if (rank == 0) {
        // 1. gathered send -> contiguous buffer; 2. contiguous send -> scattered parts (exact
        // fit); 3. gathered send -> parts larger than the message; 4. -> parts too small, with
        // overflow; 5. -> parts too small, no overflow; 6. -> resizing vector.
        const std::span<const std::byte> gathered[] = {all.first(s.header), all.subspan(s.header, s.middle),
                                                       std::span<const std::byte>{}, all.subspan(s.header + s.middle)};
        if (!arrives_first) t.irecv(1, note_tag, std::span(note)).wait(d());
        std::vector<decltype(t.isend(1, data_tag, dtrain::signature{}, all))> sent;
        for (int k = 1; k <= 6; ++k) {
          sent.push_back(k == 2 ? t.isend(1, data_tag, dtrain::signature{}, all)
                                : t.isend(1, data_tag, dtrain::signature{}, dtrain::gather_list(gathered)));
        }
        if (arrives_first) t.isend(1, note_tag, dtrain::signature{}, std::span<const std::byte>(note)).wait(d());
        for (auto& r : sent) r.wait(d());
        continue;
      }
      const std::string where =
          std::to_string(s.total()) + " bytes" + (arrives_first ? ", arrived first" : ", posted first");
      if (arrives_first) t.irecv(0, note_tag, std::span(note)).wait(d());
      std::vector<std::byte> buffer(s.total());                                              // 1
      std::vector<std::byte> head(s.header), body(s.total() - s.header), cleared(3);         // 2
      std::vector<std::byte> roomy_a(s.header + 5, std::byte{0xee}), roomy_b(s.total(), std::byte{0xee});  // 3
      std::vector<std::byte> small(s.header - 1, std::byte{0x5a}), overflow;                  // 4
      std::vector<std::byte> too_small(s.header - 1);                                         // 5
      std::vector<std::byte> grown(1, std::byte{3});                                          // 6
      const std::span<std::byte> exact[] = {std::span(head), std::span(body)};
      const std::span<std::byte> roomy[] = {std::span(roomy_a), std::span(roomy_b)};
      const std::span<std::byte> small_parts[] = {std::span(small)};
      const std::span<std::byte> too_small_parts[] = {std::span(too_small)};
      std::vector<decltype(t.irecv(0, data_tag, std::span(buffer)))> r;
      r.push_back(t.irecv(0, data_tag, std::span(buffer)));
      r.push_back(t.irecv(0, data_tag, dtrain::scatter_list(exact), &cleared));
      r.push_back(t.irecv(0, data_tag, dtrain::scatter_list(roomy), nullptr));
      r.push_back(t.irecv(0, data_tag, dtrain::scatter_list(small_parts), &overflow));
      r.push_back(t.irecv(0, data_tag, dtrain::scatter_list(too_small_parts), nullptr));
      r.push_back(t.irecv(0, data_tag, grown));
      if (!arrives_first) t.isend(0, note_tag, dtrain::signature{}, std::span<const std::byte>(note)).wait(d());
      std::error_code ec[6];
      bool ok[6];
      for (std::size_t k = 0; k < 6; ++k) ok[k] = r[k].wait(d(), ec[k]);
      check(ok[0] && buffer == whole, "gathered -> one buffer, " + where);
      head.insert(head.end(), body.begin(), body.end());
      check(ok[1] && head == whole && cleared.empty() && r[1].info().bytes == s.total(),
            "one buffer -> parts, " + where);
      roomy_a.insert(roomy_a.end(), roomy_b.begin(), roomy_b.end());
      const bool spare_untouched = roomy_a[s.total()] == std::byte{0xee};  // nothing past the message
      roomy_a.resize(s.total());
      check(ok[2] && roomy_a == whole && spare_untouched && r[2].info().bytes == s.total(),
            "gathered -> roomier parts, " + where);
      const bool parts_untouched = small == std::vector<std::byte>(s.header - 1, std::byte{0x5a});
      check(ok[3] && overflow == whole && parts_untouched && r[3].info().bytes == s.total(),
            "gathered -> overflow, " + where);
      check(!ok[4] && ec[4] == dtrain::errc::message_truncated, "truncation, " + where);
      check(ok[5] && grown == whole, "gathered -> resizing vector, " + where);
    }
  }
  // A gathered self-send into parts.
  const auto mine = pattern(100, 99);
  const std::span<const std::byte> out[] = {std::span(mine).first(10), std::span(mine).subspan(10)};
  auto sent = t.isend(rank, data_tag, dtrain::signature{}, dtrain::gather_list(out));
  std::vector<std::byte> a(60), b(40);
  const std::span<std::byte> into[] = {std::span(a), std::span(b)};
  t.irecv(rank, data_tag, dtrain::scatter_list(into), nullptr).wait(d());
  sent.wait(d());
  a.insert(a.end(), b.begin(), b.end());
  check(a == mine, "gathered self-send into parts");
}

}  // namespace parts_case
