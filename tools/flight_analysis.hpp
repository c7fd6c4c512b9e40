// Reading a job's flight-recorder dumps (include/dtrain/flight/dump.hpp writes them) and saying
// what happened: the first call where ranks disagree, the ranks that never reached a call and
// what each was doing instead, the ranks that died. dtrain-run prints it when a job fails or runs
// past its time limit; `dtrain-run --analyze DIR` reads the dumps of a job launched otherwise.

#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace dtrain_tools::flight {

/// One `call` line of a dump.
struct call_record {
  std::uint64_t id = 0, tag = 0, seq = 0, count = 0;
  int rank = -1, group_rank = -1, group_size = 0, root = 0, peer = -1, generation = 0;
  std::string group, op, algo, dtype, redop, state, dir, note;
  std::int64_t start_us = 0, end_us = 0;

  bool in_progress() const { return state == "started" || state == "waiting"; }
  // A point-to-point send or receive (flight/recorded.hpp): `seq` counts its messages between the
  // two ranks on its tag.
  bool message() const { return op == "message"; }
  bool sending() const { return dir == "send"; }
  // Where the call stands: "call 4 of group 'world', allreduce (...)", or for a message
  // "receive 3 from rank 0 (tag 7 of group 'world', 16 float32)".
  std::string where() const {
    if (!message()) return "call " + std::to_string(seq) + " of group '" + group + "', " + what();
    return std::string(sending() ? "send " : "receive ") + std::to_string(seq) + (sending() ? " to" : " from") +
           " rank " + std::to_string(peer) + " (tag " + std::to_string(tag) + " of group '" + group + "', " +
           std::to_string(count) + " " + dtype + ")";
  }
  // What every rank must agree on: operation, element type, reduction, count and root.
  std::string what() const {
    std::string s = op + " (" + dtype;
    if (op == "allreduce" || op == "reduce" || op == "reduce_scatter" || op == "reduce_scatterv") s += " " + redop;
    s += ", count " + std::to_string(count);
    if (op == "broadcast" || op == "reduce" || op == "gather" || op == "scatter" || op == "gatherv" ||
        op == "scatterv") {
      s += ", root " + std::to_string(root);
    }
    return s + ")";
  }
};

/// One process's dump file.
struct dump {
  std::string file, reason, first;
  int rank = -1;
  long pid = 0;
  std::int64_t dumped_us = 0;
  std::vector<call_record> calls;
};

/// Reads one dump. @returns false, with `problem` set, for a file that is not one.
inline bool read_dump(const std::filesystem::path& path, dump& out, std::string& problem) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line) || line != "dtrain flight recorder 1") {
    problem = path.string() + " is not a dtrain flight-recorder dump (version 1)";
    return false;
  }
  out = dump{};
  out.file = path.string();
  while (std::getline(in, line)) {
    const auto space = line.find(' ');
    const std::string key = line.substr(0, space);
    const std::string rest = space == std::string::npos ? "" : line.substr(space + 1);
    try {
      if (key == "rank") out.rank = std::stoi(rest);
      else if (key == "pid") out.pid = std::stol(rest);
      else if (key == "dumped_us") out.dumped_us = std::stoll(rest);
      else if (key == "reason") out.reason = rest;
      else if (key == "first") out.first = rest;
      else if (key == "call") {
        call_record c;
        const auto note_at = rest.find(" note=");
        if (note_at != std::string::npos) c.note = rest.substr(note_at + 6);
        std::istringstream fields(rest.substr(0, note_at));
        for (std::string f; fields >> f;) {
          const auto eq = f.find('=');
          const std::string k = f.substr(0, eq), v = eq == std::string::npos ? "" : f.substr(eq + 1);
          if (k == "id") c.id = std::stoull(v);
          else if (k == "rank") c.rank = std::stoi(v);
          else if (k == "group") c.group = v;
          else if (k == "grank") c.group_rank = std::stoi(v);
          else if (k == "gsize") c.group_size = std::stoi(v);
          else if (k == "tag") c.tag = std::stoull(v);
          else if (k == "gen") c.generation = std::stoi(v);
          else if (k == "seq") c.seq = std::stoull(v);
          else if (k == "op") c.op = v;
          else if (k == "algo") c.algo = v;
          else if (k == "dtype") c.dtype = v;
          else if (k == "redop") c.redop = v;
          else if (k == "root") c.root = std::stoi(v);
          else if (k == "count") c.count = std::stoull(v);
          else if (k == "state") c.state = v;
          else if (k == "peer") c.peer = std::stoi(v);
          else if (k == "dir") c.dir = v;
          else if (k == "start_us") c.start_us = std::stoll(v);
          else if (k == "end_us") c.end_us = std::stoll(v);
        }
        out.calls.push_back(std::move(c));
      }
    } catch (const std::exception&) {
      problem = path.string() + ": unreadable line '" + line + "'";
      return false;
    }
  }
  return true;
}

/// Every `flight.*.txt` in `dir`, each that cannot be read named in `problems`.
inline std::vector<dump> read_directory(const std::filesystem::path& dir, std::vector<std::string>& problems) {
  std::vector<dump> dumps;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("flight.", 0) != 0 || entry.path().extension() != ".txt") continue;
    dump d;
    std::string problem;
    if (read_dump(entry.path(), d, problem)) dumps.push_back(std::move(d));
    else problems.push_back(problem);
  }
  if (ec) problems.push_back("cannot read " + dir.string() + ": " + ec.message());
  std::sort(dumps.begin(), dumps.end(), [](const dump& a, const dump& b) { return a.rank < b.rank; });
  return dumps;
}

/// What the launcher knows beside the dumps: the world size and how each rank ended.
struct launch_facts {
  int world_size = 0;
  std::map<int, std::string> ends;  // rank -> "exited with status 0", "was killed by signal 9 (SIGKILL)"
};

namespace detail {

inline std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i > 0 ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

inline std::string seconds(std::int64_t us) {
  std::ostringstream s;
  s.precision(1);
  s << std::fixed << static_cast<double>(us) / 1e6 << " s";
  return s.str();
}

inline bool fatal(const std::string& reason) {
  return reason.rfind("signal SIG", 0) == 0 && reason != "signal SIGTERM";
}

// One communicator: a group, the tag that tells two communicators (and two groups of one name)
// apart, and which communicator of them it is (one rebuilt after a failure counts again from 0).
struct channel {
  std::string group;
  std::uint64_t tag;
  int generation;
  int size;
  std::map<int, std::map<std::uint64_t, call_record>> by_rank;  // world rank -> seq -> its call
};

}  // namespace detail

/// What happened, a finding a line, most telling first.
inline std::vector<std::string> analyze(const std::vector<dump>& dumps, const launch_facts& facts) {
  using detail::rank_list;
  std::vector<std::string> findings;
  std::map<std::tuple<std::string, std::uint64_t, int>, detail::channel> channels;
  std::map<int, const dump*> dump_of;  // world rank -> the dump its process wrote
  std::map<int, std::vector<const call_record*>> running;  // world rank -> its calls in progress
  std::map<int, const call_record*> latest;  // world rank -> its last call started
  std::vector<const call_record*> messages;  // point-to-point sends and receives
  // (rank, peer, group, tag, sending) -> the highest number it posted there
  std::map<std::tuple<int, int, std::string, std::uint64_t, bool>, std::uint64_t> highest;
  for (const dump& d : dumps) {
    if (d.rank >= 0) dump_of[d.rank] = &d;
    for (const call_record& c : d.calls) {
      dump_of.try_emplace(c.rank, &d);
      if (c.in_progress()) running[c.rank].push_back(&c);  // oldest first: the ring's order
      if (!latest.count(c.rank) || latest[c.rank]->start_us < c.start_us) latest[c.rank] = &c;
      if (c.message()) {
        messages.push_back(&c);
        if (c.state == "withdrawn") continue;  // its number went to the next message
        auto& k = highest[{c.rank, c.peer, c.group, c.tag, c.sending()}];
        k = std::max(k, c.seq);
        continue;
      }
      auto& ch = channels[{c.group, c.tag, c.generation}];
      ch.group = c.group;
      ch.tag = c.tag;
      ch.generation = c.generation;
      ch.size = c.group_size;
      ch.by_rank[c.rank][c.seq] = c;
    }
  }
  const int world = std::max(facts.world_size, dump_of.empty() ? 0 : dump_of.rbegin()->first + 1);

  // What a rank was doing when its record ends, and how telling that is (0: it died or left no
  // record, the likeliest cause; 1: user code; 2: another call; 3: it failed itself, a consequence).
  auto fate = [&](int rank) -> std::pair<int, std::string> {
    const auto d = dump_of.find(rank);
    const auto end = facts.ends.find(rank);
    if (d != dump_of.end() && detail::fatal(d->second->first)) return {0, "it died (" + d->second->first + ")"};
    // No dump, or only the empty one a process writes when its first communicator is built.
    if (d == dump_of.end() || d->second->reason == "started") {
      return {0, "it left no flight record" + (end != facts.ends.end() ? " (it " + end->second + ")" : std::string())};
    }
    // How the launcher saw it end, after what its record says (which may be older).
    const std::string ended = end != facts.ends.end() ? "; it " + end->second : "";
    // The latest call it entered and was in: a collective, or a message it waited for (one posted
    // ahead and not waited for yet is no place to be stuck).
    const call_record* in = nullptr;
    if (auto r = running.find(rank); r != running.end()) {
      for (const call_record* x : r->second) {
        if (x->state == "waiting" || !x->message()) in = x;
      }
    }
    if (in != nullptr) {
      std::string s = "it was in " + in->where();
      if (in->state == "waiting") s += in->message() ? ", waiting" : ", waiting on rank " + std::to_string(in->peer);
      return {2, s + ended};
    }
    const auto l = latest.find(rank);
    if (l != latest.end() && l->second->state == "failed") {
      const call_record& c = *l->second;
      std::string why = c.note.size() > 240 ? c.note.substr(0, 240) + "..." : c.note;
      return {3, "it failed in " + c.where() + ": " + why + ended};
    }
    std::string s = "it was in none of its collectives when it dumped";
    std::int64_t ended_us = 0;  // the end of its last call that ended
    for (const call_record& c : d->second->calls) {
      if (c.rank == rank) ended_us = std::max(ended_us, c.end_us);
    }
    if (ended_us > 0) {
      s += ", " + detail::seconds(d->second->dumped_us - ended_us) + " after its last one ended (user code)";
    }
    return {1, s + ended};
  };

  for (auto& [key, ch] : channels) {
    std::string where = "of group '" + ch.group + "'";
    if (ch.generation > 0) where += " (its communicator " + std::to_string(ch.generation + 1) + ")";
    // Members: the ranks with a record here, those that a call here waited on, and for the world
    // every rank of the job.
    std::set<int> members;
    for (const auto& [rank, calls] : ch.by_rank) {
      members.insert(rank);
      for (const auto& [seq, c] : calls) {
        if (c.peer >= 0) members.insert(c.peer);
      }
    }
    if (ch.group == "world") {
      for (int r = 0; r < std::max(world, ch.size); ++r) members.insert(r);
    }
    // The first call the ranks recorded differently.
    std::set<std::uint64_t> seqs;
    for (const auto& [rank, calls] : ch.by_rank) {
      for (const auto& [seq, c] : calls) seqs.insert(seq);
    }
    bool disagreed = false;
    for (std::uint64_t seq : seqs) {
      // The algorithm too (ranks whose DTRAIN_ALGORITHMS differ pick different ones for one
      // call), named only where the calls are otherwise alike.
      std::set<std::string> whats;
      for (const auto& [rank, calls] : ch.by_rank) {
        if (auto c = calls.find(seq); c != calls.end()) whats.insert(c->second.what());
      }
      std::map<std::string, std::vector<int>> forms;
      for (const auto& [rank, calls] : ch.by_rank) {
        const auto c = calls.find(seq);
        if (c == calls.end()) continue;
        const std::string by = whats.size() == 1 && !c->second.algo.empty() ? " by " + c->second.algo : "";
        forms[c->second.what() + by].push_back(rank);
      }
      if (forms.size() < 2) continue;
      std::vector<std::pair<std::vector<int>, std::string>> sides;
      for (const auto& [what, ranks] : forms) sides.push_back({ranks, what});
      std::sort(sides.begin(), sides.end(),
                [](const auto& a, const auto& b) { return a.first.size() < b.first.size(); });
      std::string s = "call " + std::to_string(seq) + " " + where + ": the ranks disagree:";
      for (std::size_t i = 0; i < sides.size(); ++i) {
        s += (i > 0 ? ";" : "") + std::string(" ") + rank_list(sides[i].first) +
             (sides[i].first.size() == 1 ? " calls " : " call ") + sides[i].second;
      }
      findings.push_back(s);
      disagreed = true;
      break;
    }
    // The last call any rank entered, and the members that never reached it.
    std::uint64_t top = 0;
    const call_record* top_call = nullptr;
    for (const auto& [rank, calls] : ch.by_rank) {
      if (!calls.empty() && (top_call == nullptr || calls.rbegin()->first > top)) {
        top = calls.rbegin()->first;
        top_call = &calls.rbegin()->second;
      }
    }
    if (top_call == nullptr || disagreed) continue;
    std::vector<int> reached;
    for (const auto& [rank, calls] : ch.by_rank) {
      if (calls.count(top)) reached.push_back(rank);
    }
    std::vector<std::pair<int, std::string>> behind;  // the likeliest cause first
    for (int rank : members) {
      const auto mine = ch.by_rank.find(rank);
      if (mine != ch.by_rank.end() && mine->second.count(top)) continue;
      std::string s = "rank " + std::to_string(rank) + " never reached call " + std::to_string(top) + " " + where +
                      ", " + top_call->what() + ", which " + rank_list(reached) + " entered";
      if (mine != ch.by_rank.end() && !mine->second.empty()) {
        const call_record& last = mine->second.rbegin()->second;
        s += "; its last there was call " + std::to_string(last.seq) + " (" + last.state + ")";
      }
      const auto [rank_of_cause, what] = fate(rank);
      behind.push_back({rank_of_cause, s + "; " + what});
    }
    std::stable_sort(behind.begin(), behind.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& [cause, s] : behind) findings.push_back(std::move(s));
  }
  // Messages that failed on their own (a peer's send of another type or size: the note says how
  // and ends with that error's words), and those waited for and never matched: what the peer
  // posted there, and what it did instead. A message its group's failure took (a lost peer, or a
  // rank that aborted the group, which the others then raise with its code: the note is the bare
  // words or quotes the abort) is told above.
  auto own_failure = [](const std::string& note) {
    if (note.find("aborted the group") != std::string::npos) return false;
    for (const char* why : {"collective mismatch between ranks", "message larger than the receive buffer",
                            "protocol error"}) {
      const std::size_t n = std::strlen(why);
      if (note.size() > n && note.compare(note.size() - n, std::string::npos, why) == 0) return true;
    }
    return false;
  };
  for (const call_record* m : messages) {
    if (m->state == "failed" && own_failure(m->note)) {
      findings.push_back("rank " + std::to_string(m->rank) + "'s " + m->where() + " failed: " + m->note);
      continue;
    }
    if (m->state != "waiting") continue;
    // The peer's messages of the other direction to this rank there.
    const auto other = highest.find({m->peer, m->rank, m->group, m->tag, !m->sending()});
    const std::uint64_t posted = other != highest.end() ? other->second : 0;
    if (posted >= m->seq) continue;  // matched: it is on its way
    std::string s = "rank " + std::to_string(m->rank) + " waits in " + m->where() + "; rank " +
                    std::to_string(m->peer) + " posted " + (posted == 0 ? "no" : "only " + std::to_string(posted)) +
                    (m->sending() ? " receive" : " send") + (posted == 1 ? "" : "s") + " there; ";
    findings.push_back(s + fate(m->peer).second);
  }
  // Deaths the calls above do not explain (a rank that died between two groups' calls).
  for (int rank = 0; rank < world; ++rank) {
    const auto d = dump_of.find(rank);
    const bool silent = d == dump_of.end() || d->second->reason == "started" || detail::fatal(d->second->first);
    const std::string f = silent ? fate(rank).second : "";
    if (f.empty()) continue;
    const std::string line = "rank " + std::to_string(rank) + ": " + f;
    bool said = false;
    for (const auto& s : findings) said = said || s.find("rank " + std::to_string(rank) + " never") == 0;
    if (!said) findings.push_back(line);
  }
  if (findings.empty()) findings.push_back("every rank recorded the same calls, and none is missing one");
  return findings;
}

}  // namespace dtrain_tools::flight
