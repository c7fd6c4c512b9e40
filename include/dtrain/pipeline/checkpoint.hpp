#pragma once
/// @file
/// Checkpoints of one pipeline rank: its chunks' parameters, its updater's state, the step and
/// update counts (the data position: micro-batches are numbered by step), and what identifies
/// its place in the job (schedule, pipeline shape, rank, stages, tensor sizes), so that resuming
/// with another partition, schedule or updater is refused with the difference named instead of
/// loading parameters into the wrong layers. Each file is written atomically; a job's checkpoint
/// is one file per pipeline rank (and tensor-parallel rank), from one replica.
///
/// Format (little-endian, inside `detail/checkpoint_io.hpp`'s envelope: "DTRNPIPE", fields,
/// FNV-1a-64 checksum): format (u32), value bytes (u32), updater name (string), state slots
/// (u32), schedule name (string), ranks, chunks, micro-batches, rank (u32 each), steps and
/// updates (u64 each), stage count (u32) + stages (i32), tensor count (u32) + sizes (u64), the
/// parameters of every tensor in order, then the updater's state.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/detail/checkpoint_io.hpp"

namespace dtrain::pipeline {

/// What a pipeline rank's checkpoint says about its place in the job.
struct checkpoint_identity {
  std::string updater;
  std::uint32_t state_slots = 0;
  std::uint32_t value_bytes = 0;
  std::string schedule;
  std::uint32_t ranks = 1, chunks = 1, micro_batches = 1, rank = 0;
  std::vector<std::int32_t> stages;   ///< the stage each chunk runs
  std::vector<std::uint64_t> sizes;   ///< every tensor's size, chunk by chunk
};

/// Where the job was when the checkpoint was taken.
struct checkpoint_position {
  std::uint64_t steps = 0;
  std::uint64_t updates = 0;
};

namespace detail {

inline constexpr char pipeline_checkpoint_magic[8] = {'D', 'T', 'R', 'N', 'P', 'I', 'P', 'E'};
inline constexpr std::uint32_t pipeline_checkpoint_format = 1;

// The first difference between what the file says and what this rank is, in words; empty if none.
inline std::string difference(const checkpoint_identity& file, const checkpoint_identity& me) {
  if (file.updater != me.updater || file.state_slots != me.state_slots || file.value_bytes != me.value_bytes) {
    return "was written with updater " + file.updater + " on " + std::to_string(file.value_bytes) +
           "-byte values; this trainer runs " + me.updater + " on " + std::to_string(me.value_bytes) + "-byte values";
  }
  if (file.schedule != me.schedule || file.ranks != me.ranks || file.chunks != me.chunks || file.rank != me.rank) {
    return "belongs to pipeline rank " + std::to_string(file.rank) + " of " + std::to_string(file.ranks) + " (" +
           file.schedule + ", " + std::to_string(file.chunks) + " chunks); this is rank " + std::to_string(me.rank) +
           " of " + std::to_string(me.ranks) + " (" + me.schedule + ", " + std::to_string(me.chunks) + " chunks)";
  }
  if (file.micro_batches != me.micro_batches) {
    return "was written with " + std::to_string(file.micro_batches) + " micro-batches a step, this trainer runs " +
           std::to_string(me.micro_batches) + " (the data position would not carry over)";
  }
  if (file.stages != me.stages || file.sizes != me.sizes) {
    using dtrain::detail::list_text;
    return "holds stages " + list_text(file.stages) + " with tensors of sizes " + list_text(file.sizes) +
           "; this rank's are " + list_text(me.stages) + " with " + list_text(me.sizes) +
           " (a different partition of the model?)";
  }
  return {};
}

}  // namespace detail

/// Writes `parameters` (every tensor in order) and `state` (the updater's) to `path` atomically.
template <class T>
void save_pipeline_checkpoint(const std::string& path, const checkpoint_identity& id, const checkpoint_position& at,
                              const std::vector<std::span<T>>& parameters, std::span<const T> state) {
  auto w = dtrain::detail::checkpoint_writer(detail::pipeline_checkpoint_magic);
  w.put(detail::pipeline_checkpoint_format);
  w.put(id.value_bytes);
  w.put(std::string_view(id.updater));
  w.put(id.state_slots);
  w.put(std::string_view(id.schedule));
  for (std::uint32_t v : {id.ranks, id.chunks, id.micro_batches, id.rank}) w.put(v);
  w.put(at.steps);
  w.put(at.updates);
  w.put(static_cast<std::uint32_t>(id.stages.size()));
  for (std::int32_t s : id.stages) w.put(s);
  w.put(static_cast<std::uint32_t>(id.sizes.size()));
  for (std::uint64_t n : id.sizes) w.put(n);
  for (const auto& p : parameters) {
    for (T v : p) w.put(v);
  }
  for (T v : state) w.put(v);
  dtrain::detail::write_checkpoint(path, w);
}

/// Reads a checkpoint into `parameters` and `state` if it was written by a rank in the place
/// `me` describes; returns its position. Nothing is changed unless the whole file is good.
/// @throws dtrain::error `bad_data` naming the file and the fault: unreadable, not a pipeline
///   checkpoint, corrupt, truncated, or written for another updater, schedule, rank, number of
///   micro-batches or partition (the difference named).
template <class T>
checkpoint_position load_pipeline_checkpoint(const std::string& path, const checkpoint_identity& me,
                                             const std::vector<std::span<T>>& parameters, std::span<T> state) {
  const auto body = dtrain::detail::read_checkpoint(path, detail::pipeline_checkpoint_magic, "pipeline checkpoint");
  auto bad = [&](const std::string& what) { return error(errc::bad_data, "checkpoint " + path + " " + what); };
  dtrain::detail::byte_reader r(body, "checkpoint " + path);
  if (const auto f = r.get<std::uint32_t>(); f != detail::pipeline_checkpoint_format) {
    throw bad("has format " + std::to_string(f) + "; this build reads format " +
              std::to_string(detail::pipeline_checkpoint_format));
  }
  checkpoint_identity file;
  file.value_bytes = r.get<std::uint32_t>();
  file.updater = r.get_string();
  file.state_slots = r.get<std::uint32_t>();
  file.schedule = r.get_string();
  for (std::uint32_t* v : {&file.ranks, &file.chunks, &file.micro_batches, &file.rank}) *v = r.get<std::uint32_t>();
  checkpoint_position at;
  at.steps = r.get<std::uint64_t>();
  at.updates = r.get<std::uint64_t>();
  const auto stages = r.get<std::uint32_t>();
  r.need(std::size_t{stages} * 4);
  for (std::uint32_t i = 0; i < stages; ++i) file.stages.push_back(r.get<std::int32_t>());
  const auto tensors = r.get<std::uint32_t>();
  r.need(std::size_t{tensors} * 8);
  for (std::uint32_t i = 0; i < tensors; ++i) file.sizes.push_back(r.get<std::uint64_t>());
  if (const std::string d = detail::difference(file, me); !d.empty()) throw bad(d);
  std::size_t values = state.size();
  for (const auto& p : parameters) values += p.size();
  if (r.remaining() != values * sizeof(T)) throw bad("is truncated or holds more than its header says");
  for (const auto& p : parameters) {
    for (T& v : p) v = r.get<T>();
  }
  for (T& v : state) v = r.get<T>();
  return at;
}

}  // namespace dtrain::pipeline
