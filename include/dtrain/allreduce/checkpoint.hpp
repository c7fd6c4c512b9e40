#pragma once
/// @file
/// Checkpoints of one allreduce-trainer rank: its parameters, its updater's state, the step
/// count, the learning rate and where it is in its data (`data::sampler_position`), with what
/// identifies the job (updater, world size, the tensors' sizes, the options that shape the
/// traffic), so that resuming another model, world size or updater is refused with the
/// difference named. Written atomically (`detail/checkpoint_io.hpp`); one file per rank.
///
/// Format (little-endian, inside the "DTRNALLR" envelope with its FNV-1a-64 checksum): format
/// (u32), value bytes (u32), updater name (string), state slots (u32), world size, rank (u32
/// each), replicas identical (u8), options digest (u64), tensor count (u32) + sizes (u64),
/// steps (u64), learning rate (f64), epoch and next sample (u64 each), loss scale (f64) and good
/// steps (u64) (format 2; format 1 has neither, and loads with scale 1), the parameters of every
/// tensor in order (a 16-bit model's float master copy), then the updater's state.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/data/sampler.hpp"
#include "dtrain/detail/checkpoint_io.hpp"

namespace dtrain::allreduce {

/// What a rank's checkpoint says about the job that wrote it.
struct checkpoint_identity {
  std::string updater;
  std::uint32_t state_slots = 0;
  std::uint32_t value_bytes = 0;
  std::uint32_t world = 1;
  std::uint32_t rank = 0;
  bool replicas_identical = true;  ///< synchronous training: any rank's file is every rank's
  std::uint64_t options = 0;       ///< compression and local SGD, as digested at start-up
  std::vector<std::uint64_t> sizes;
};

/// What a checkpoint restores besides the tensors.
struct checkpoint_state {
  std::uint64_t steps = 0;
  double learning_rate = 0;
  data::sampler_position position;
  double loss_scale = 1;          ///< the loss scaler's scale (format 2; 1 without loss scaling)
  std::uint64_t good_steps = 0;   ///< and its good steps in a row
};

namespace detail {

inline constexpr char allreduce_checkpoint_magic[8] = {'D', 'T', 'R', 'N', 'A', 'L', 'L', 'R'};
inline constexpr std::uint32_t allreduce_checkpoint_format = 2;

// The first difference between the file and this rank, in words; empty if none.
inline std::string difference(const checkpoint_identity& file, const checkpoint_identity& me) {
  if (file.updater != me.updater || file.state_slots != me.state_slots || file.value_bytes != me.value_bytes) {
    return "was written with updater " + file.updater + " on " + std::to_string(file.value_bytes) +
           "-byte values; this trainer runs " + me.updater + " on " + std::to_string(me.value_bytes) + "-byte values";
  }
  if (file.world != me.world) {
    return "was written by a job of " + std::to_string(file.world) + " ranks; this job has " +
           std::to_string(me.world) + " (the data shards and the averaging would not carry over)";
  }
  if (file.sizes != me.sizes) {
    return "holds tensors of sizes " + dtrain::detail::list_text(file.sizes) + "; this model's are " +
           dtrain::detail::list_text(me.sizes) + " (another model?)";
  }
  if (file.options != me.options) {
    return "was written with other compression or local SGD options; pass the same trainer_options";
  }
  if (!file.replicas_identical && file.rank != me.rank) {
    return "holds rank " + std::to_string(file.rank) + "'s own replica (saved during local SGD); this is rank " +
           std::to_string(me.rank);
  }
  return {};
}

/// Given every rank's (loaded: 0 or 1, step) pair after a collective load, "" if every rank
/// loaded a checkpoint of rank 0's step, else what the first rank that did not did.
inline std::string load_disagreement(std::span<const std::int64_t> all) {
  for (std::size_t r = 0; r < all.size() / 2; ++r) {
    if (all[2 * r] == 0) return "rank " + std::to_string(r) + " could not load its checkpoint";
    if (all[2 * r + 1] != all[1]) {
      return "rank " + std::to_string(r) + " loaded a checkpoint of step " + std::to_string(all[2 * r + 1]) +
             ", rank 0 one of step " + std::to_string(all[1]);
    }
  }
  return {};
}

}  // namespace detail

/// Writes `parameters` (every tensor in order) and `state` (the updater's) to `path` atomically.
template <class T>
void save_allreduce_checkpoint(const std::string& path, const checkpoint_identity& id, const checkpoint_state& at,
                               const std::vector<std::span<T>>& parameters, std::span<const T> state) {
  auto w = dtrain::detail::checkpoint_writer(detail::allreduce_checkpoint_magic);
  w.put(detail::allreduce_checkpoint_format);
  w.put(id.value_bytes);
  w.put(std::string_view(id.updater));
  w.put(id.state_slots);
  w.put(id.world);
  w.put(id.rank);
  w.put(static_cast<std::uint8_t>(id.replicas_identical ? 1 : 0));
  w.put(id.options);
  w.put(static_cast<std::uint32_t>(id.sizes.size()));
  for (std::uint64_t n : id.sizes) w.put(n);
  w.put(at.steps);
  w.put(at.learning_rate);
  w.put(at.position.epoch);
  w.put(at.position.next);
  w.put(at.loss_scale);
  w.put(at.good_steps);
  for (const auto& p : parameters) {
    for (T v : p) w.put(v);
  }
  for (T v : state) w.put(v);
  dtrain::detail::write_checkpoint(path, w);
}

/// Reads a checkpoint written for a rank in the place `me` describes: its tensors into
/// `parameters` (flat, every tensor in order) and `state`, both sized by the caller. Nothing
/// outside those two is touched.
/// @throws dtrain::error `bad_data` naming the file and the fault: unreadable, not an allreduce
///   checkpoint, corrupt, truncated, or written for another updater, world size, model,
///   options or (during local SGD) rank.
template <class T>
checkpoint_state load_allreduce_checkpoint(const std::string& path, const checkpoint_identity& me,
                                           std::span<T> parameters, std::span<T> state) {
  const auto body = dtrain::detail::read_checkpoint(path, detail::allreduce_checkpoint_magic, "allreduce checkpoint");
  auto bad = [&](const std::string& what) { return error(errc::bad_data, "checkpoint " + path + " " + what); };
  dtrain::detail::byte_reader r(body, "checkpoint " + path);
  const auto format = r.get<std::uint32_t>();
  if (format != 1 && format != detail::allreduce_checkpoint_format) {
    throw bad("has format " + std::to_string(format) + "; this build reads formats 1 and " +
              std::to_string(detail::allreduce_checkpoint_format));
  }
  checkpoint_identity file;
  file.value_bytes = r.get<std::uint32_t>();
  file.updater = r.get_string();
  file.state_slots = r.get<std::uint32_t>();
  file.world = r.get<std::uint32_t>();
  file.rank = r.get<std::uint32_t>();
  file.replicas_identical = r.get<std::uint8_t>() != 0;
  file.options = r.get<std::uint64_t>();
  const auto tensors = r.get<std::uint32_t>();
  r.need(std::size_t{tensors} * 8);
  for (std::uint32_t i = 0; i < tensors; ++i) file.sizes.push_back(r.get<std::uint64_t>());
  if (const std::string d = detail::difference(file, me); !d.empty()) throw bad(d);
  checkpoint_state at;
  at.steps = r.get<std::uint64_t>();
  at.learning_rate = r.get<double>();
  at.position.epoch = r.get<std::uint64_t>();
  at.position.next = r.get<std::uint64_t>();
  if (format >= 2) {
    at.loss_scale = r.get<double>();
    at.good_steps = r.get<std::uint64_t>();
  }
  if (r.remaining() != (parameters.size() + state.size()) * sizeof(T)) {
    throw bad("is truncated or holds more than its header says");
  }
  for (T& v : parameters) v = r.get<T>();
  for (T& v : state) v = r.get<T>();
  return at;
}

}  // namespace dtrain::allreduce
