#pragma once
/// @file
/// `ps::shard_checkpoints`: where one server shard writes its checkpoints, which it keeps, and how
/// it finds and loads the one to resume from. The file format is in checkpoint.hpp.

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/ps/checkpoint.hpp"

namespace dtrain::ps {

/// Shard `shard` of `shards` writes `<prefix>.shard<s>.c<clock>.sparse` and `.dense` and keeps
/// the two newest clocks: a shard that died may not have written the newest one, so the newest
/// clock every shard has may be the one before.
class shard_checkpoints {
 public:
  /// @param every write one every `every` clocks (0: only when asked)
  shard_checkpoints(std::string prefix, int shard, int shards, std::int64_t every = 0)
      : prefix_(std::move(prefix)), shard_(shard), shards_(shards), every_(every) {}

  bool enabled() const noexcept { return !prefix_.empty(); }

  /// The periodic checkpoints start after clock `slowest` (0, or the clock a job resumed at).
  void start_after(std::int64_t slowest) noexcept { next_ = every_ > 0 ? (slowest / every_ + 1) * every_ : 0; }

  /// Whether a periodic checkpoint is due now that every worker has finished the clocks before
  /// `slowest`; if so, the next is due `every` clocks on.
  bool due(std::int64_t slowest) noexcept {
    if (next_ <= 0 || slowest < next_) return false;
    next_ = (slowest / every_ + 1) * every_;
    return true;
  }

  /// Writes both tables (atomically each) as of clock `at`, then removes all but the two newest.
  template <class Table>
  void save(Table& sparse, Table& dense, const shard_state& st, std::int64_t at) {
    save_checkpoint(path(at, "sparse"), sparse, st);
    save_checkpoint(path(at, "dense"), dense, st);
    if (written_.empty() || written_.back() != at) written_.push_back(at);
    while (written_.size() > 2) {
      std::remove(path(written_.front(), "sparse").c_str());
      std::remove(path(written_.front(), "dense").c_str());
      written_.erase(written_.begin());
    }
  }

  /// Loads both tables from clock `at` (-1: the newest clock every shard has a checkpoint of)
  /// and @returns their state, checked against this job's `workers`.
  /// @throws dtrain::error `invalid_argument` without a prefix; `bad_data` when no clock is
  ///   complete, the two files disagree, or the worker count differs.
  template <class Table>
  shard_state restore(Table& sparse, Table& dense, std::int64_t at, std::size_t workers) const {
    if (!enabled()) throw error(errc::invalid_argument, "ps::server: resume asked without a checkpoint prefix");
    if (at < 0) {
      const auto common = latest_common_checkpoint(prefix_, shards_);
      if (!common) {
        throw error(errc::bad_data, who() + ": no clock has a checkpoint of every one of the " +
                                        std::to_string(shards_) + " shards at " + prefix_);
      }
      at = *common;
    }
    const auto shard = static_cast<std::uint32_t>(shard_), shards = static_cast<std::uint32_t>(shards_);
    auto s = load_checkpoint(path(at, "sparse"), sparse, shard, shards);
    const auto d = load_checkpoint(path(at, "dense"), dense, shard, shards);
    if (s.version != d.version || s.clocks != d.clocks) {
      throw error(errc::bad_data,
                  who() + ": the sparse and dense checkpoints at " + prefix_ + " are from different moments");
    }
    if (s.clocks.size() != workers) {
      throw error(errc::bad_data, who() + ": the checkpoint has " + std::to_string(s.clocks.size()) +
                                      " workers' clocks; this job has " + std::to_string(workers) + " workers");
    }
    return s;
  }

 private:
  std::string path(std::int64_t at, const char* which) const { return checkpoint_file(prefix_, shard_, at, which); }
  std::string who() const { return "ps::server " + std::to_string(shard_); }

  std::string prefix_;
  int shard_;
  int shards_;
  std::int64_t every_;
  std::int64_t next_ = 0;
  std::vector<std::int64_t> written_;  // clocks of the checkpoints on disk, oldest first
};

}  // namespace dtrain::ps
