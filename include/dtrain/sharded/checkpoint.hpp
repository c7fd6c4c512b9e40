#pragma once
/// @file
/// Checkpoints of a sharded trainer: each rank writes its own shard (its slices of the master
/// parameters and of the updater's state) to `<prefix>.shard-<r>-of-<P>`, atomically, and once
/// every rank has written, rank 0 writes `<prefix>.manifest`, which makes the set whole. A set
/// loads onto any world size: each rank reads the shards that hold its new slices and takes
/// them out (layout.hpp: the parts are the same, only their cut changes).
///
/// Shard format (little-endian, in the "DTRNSHRD" envelope with its FNV-1a-64 checksum):
/// format (u32), value bytes (u32), updater (string), state slots (u32), world, rank (u32 each),
/// part count (u32) + lengths (u64), tensor count (u32) + sizes (u64), steps (u64), learning
/// rate (f64), loss scale (f64), good steps since it changed (u64), then the shard's master
/// parameters and its state (slots per parameter, interleaved). The manifest ("DTRNSHMF"):
/// format, world (u32), steps (u64).

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/detail/checkpoint_io.hpp"
#include "dtrain/sharded/agreement.hpp"
#include "dtrain/sharded/layout.hpp"
#include "dtrain/sharded/options.hpp"
#include "dtrain/updater/loss_scaler.hpp"

namespace dtrain::sharded {

/// What a shard says about the job that wrote it; what a loading trainer must match.
struct shard_identity {
  std::string updater;
  std::uint32_t state_slots = 0;
  std::uint32_t value_bytes = 0;
  std::vector<std::uint64_t> parts;  ///< the lengths of the buckets (stages 1, 2) or units (stage 3)
  std::vector<std::uint64_t> sizes;  ///< the model's tensors' sizes, in order
};

/// What a checkpoint restores besides the shards.
struct shard_state {
  std::uint64_t steps = 0;  ///< updates applied (steps skipped by loss scaling do not count)
  double learning_rate = 0;
  double loss_scale = 1;           ///< the loss scaler's scale (1 without loss scaling)
  std::uint64_t good_steps = 0;    ///< and its good steps in a row
};

/// What a trainer saves besides its shards: its `steps` (updates applied), its updater's rate and
/// its loss scale.
template <class Updater>
shard_state state_of(std::uint64_t steps, const Updater& updater, const loss_scaler& scaler) {
  return {steps, updater.learning_rate(), scaler.scale(), scaler.good_steps()};
}

/// Puts back what `state_of` took.
template <class Updater>
void restore_state(const shard_state& at, std::size_t& steps, Updater& updater, loss_scaler& scaler) {
  steps = at.steps;
  updater.set_learning_rate(at.learning_rate);
  scaler.restore(at.loss_scale, at.good_steps);
}

inline std::string shard_path(const std::string& prefix, int rank, int world) {
  return prefix + ".shard-" + std::to_string(rank) + "-of-" + std::to_string(world);
}
inline std::string manifest_path(const std::string& prefix) { return prefix + ".manifest"; }

namespace detail {

inline constexpr char shard_magic[8] = {'D', 'T', 'R', 'N', 'S', 'H', 'R', 'D'};
inline constexpr char manifest_magic[8] = {'D', 'T', 'R', 'N', 'S', 'H', 'M', 'F'};
inline constexpr std::uint32_t shard_format = 2;

inline std::vector<std::size_t> part_lengths(const shard_identity& id) {
  return {id.parts.begin(), id.parts.end()};
}

}  // namespace detail

/// Writes rank `rank` of `world`'s shard: `master` (its slices) and `state` (their updater state).
template <class T>
void save_shard(const std::string& prefix, int rank, int world, const shard_identity& id, const shard_state& at,
                std::span<const T> master, std::span<const T> state) {
  auto w = dtrain::detail::checkpoint_writer(detail::shard_magic);
  w.put(detail::shard_format);
  w.put(id.value_bytes);
  w.put(std::string_view(id.updater));
  w.put(id.state_slots);
  w.put(static_cast<std::uint32_t>(world));
  w.put(static_cast<std::uint32_t>(rank));
  w.put(static_cast<std::uint32_t>(id.parts.size()));
  for (std::uint64_t n : id.parts) w.put(n);
  w.put(static_cast<std::uint32_t>(id.sizes.size()));
  for (std::uint64_t n : id.sizes) w.put(n);
  w.put(at.steps);
  w.put(at.learning_rate);
  w.put(at.loss_scale);
  w.put(at.good_steps);
  for (T v : master) w.put(v);
  for (T v : state) w.put(v);
  dtrain::detail::write_checkpoint(shard_path(prefix, rank, world), w);
}

/// Marks the set under `prefix` whole: `world` shards of step `steps`.
inline void save_manifest(const std::string& prefix, int world, std::uint64_t steps) {
  auto w = dtrain::detail::checkpoint_writer(detail::manifest_magic);
  w.put(detail::shard_format);
  w.put(static_cast<std::uint32_t>(world));
  w.put(steps);
  dtrain::detail::write_checkpoint(manifest_path(prefix), w);
}

/// Reads the set under `prefix` (written on any number of ranks) into this rank's slices, for
/// rank `rank` of `world`: `master` and `state` sized by the caller for `me`'s layout. Nothing
/// outside those two is touched.
/// @throws dtrain::error `bad_data` naming the file and the fault: not a shard, corrupt or
///   truncated, from another step than the manifest's, or written for another updater, value
///   type, model or cut; the system error naming the manifest or a shard that cannot be read
///   (an incomplete set has no manifest).
template <class T>
shard_state load_shards(const std::string& prefix, int rank, int world, const shard_identity& me,
                        std::span<T> master, std::span<T> state) {
  const auto manifest = dtrain::detail::read_checkpoint(manifest_path(prefix), detail::manifest_magic,
                                                        "sharded checkpoint manifest");
  dtrain::detail::byte_reader m(manifest, "checkpoint " + manifest_path(prefix));
  (void)m.get<std::uint32_t>();
  const auto old_world = static_cast<int>(m.get<std::uint32_t>());
  const auto steps = m.get<std::uint64_t>();
  const shard_layout mine(detail::part_lengths(me), world), theirs(detail::part_lengths(me), old_world);
  if (master.size() != mine.shard_elements() || state.size() != mine.shard_elements() * me.state_slots) {
    throw error(errc::invalid_argument, "sharded checkpoint: buffers of " + std::to_string(master.size()) + " and " +
                                            std::to_string(state.size()) + " values for a shard of " +
                                            std::to_string(mine.shard_elements()) + " parameters");
  }
  shard_state at;
  for (int from = 0; from < old_world; ++from) {
    const std::string path = shard_path(prefix, from, old_world);
    const auto body = dtrain::detail::read_checkpoint(path, detail::shard_magic, "sharded checkpoint");
    auto bad = [&](const std::string& what) { return error(errc::bad_data, "checkpoint " + path + " " + what); };
    dtrain::detail::byte_reader r(body, "checkpoint " + path);
    if (const auto f = r.get<std::uint32_t>(); f != detail::shard_format) {
      throw bad("has format " + std::to_string(f) + "; this build reads format " +
                std::to_string(detail::shard_format));
    }
    shard_identity file;
    file.value_bytes = r.get<std::uint32_t>();
    file.updater = r.get_string();
    file.state_slots = r.get<std::uint32_t>();
    const auto file_world = r.get<std::uint32_t>(), file_rank = r.get<std::uint32_t>();
    for (auto* list : {&file.parts, &file.sizes}) {
      const auto n = r.get<std::uint32_t>();
      r.need(std::size_t{n} * 8);
      for (std::uint32_t i = 0; i < n; ++i) list->push_back(r.get<std::uint64_t>());
    }
    if (file.updater != me.updater || file.state_slots != me.state_slots || file.value_bytes != me.value_bytes) {
      throw bad("was written with updater " + file.updater + " on " + std::to_string(file.value_bytes) +
                "-byte values; this trainer runs " + me.updater + " on " + std::to_string(me.value_bytes) +
                "-byte values");
    }
    if (file.sizes != me.sizes) {
      throw bad("holds tensors of sizes " + dtrain::detail::list_text(file.sizes) + "; this model's are " +
                dtrain::detail::list_text(me.sizes) + " (another model?)");
    }
    if (file.parts != me.parts) {
      throw bad("is cut into parts of " + dtrain::detail::list_text(file.parts) + " elements; this trainer's are " +
                dtrain::detail::list_text(me.parts) + " (other bucket sizes, or another stage's units)");
    }
    if (file_world != static_cast<std::uint32_t>(old_world) || file_rank != static_cast<std::uint32_t>(from)) {
      throw bad("is rank " + std::to_string(file_rank) + " of " + std::to_string(file_world) + "; the manifest wants " +
                "rank " + std::to_string(from) + " of " + std::to_string(old_world));
    }
    at.steps = r.get<std::uint64_t>();
    at.learning_rate = r.get<double>();
    at.loss_scale = r.get<double>();
    at.good_steps = r.get<std::uint64_t>();
    if (at.steps != steps) {
      throw bad("is from step " + std::to_string(at.steps) + "; its set's manifest says step " + std::to_string(steps) +
                " (a shard left from another save?)");
    }
    const std::size_t slots = me.state_slots;
    if (r.remaining() != theirs.shard_elements() * (1 + slots) * sizeof(T)) {
      throw bad("is truncated or holds more than its header says");
    }
    std::vector<T> values(theirs.shard_elements() * (1 + slots));
    for (T& v : values) v = r.get<T>();
    const std::span<const T> old_master(values.data(), theirs.shard_elements());
    const std::span<const T> old_state(values.data() + theirs.shard_elements(), theirs.shard_elements() * slots);
    // Each part's elements both this old rank held and this rank holds now (padding excluded).
    for (std::size_t b = 0; b < me.parts.size(); ++b) {
      const std::size_t length = me.parts[b];
      const std::size_t lo = std::max(static_cast<std::size_t>(from) * theirs.slice(b),
                                       static_cast<std::size_t>(rank) * mine.slice(b));
      const std::size_t hi = std::min({static_cast<std::size_t>(from + 1) * theirs.slice(b),
                                       static_cast<std::size_t>(rank + 1) * mine.slice(b), length});
      for (std::size_t e = lo; e < hi; ++e) {
        const std::size_t src = theirs.slice_offset(b) + e - static_cast<std::size_t>(from) * theirs.slice(b);
        const std::size_t dst = mine.slice_offset(b) + e - static_cast<std::size_t>(rank) * mine.slice(b);
        master[dst] = old_master[src];
        for (std::size_t s = 0; s < slots; ++s) state[dst * slots + s] = old_state[src * slots + s];
      }
    }
  }
  return at;
}

/// Every rank writes its shard; once all have, rank 0 writes the manifest. Collective; `gather`
/// as for `all_succeeded`. @throws dtrain::error the system error on the rank that could not
///   write, and `cancelled` naming that rank on the others; the set then has no manifest and
///   will not load.
template <class T, class Collective, class Gather>
void save_sharded(Collective& comm, Gather&& gather, const std::string& who, const std::string& prefix,
                  const shard_identity& id, const shard_state& at, std::span<const T> master,
                  std::span<const T> state) {
  auto attempt = [](auto&& write) {
    try {
      write();
    } catch (const error&) {
      return std::current_exception();
    }
    return std::exception_ptr();
  };
  all_succeeded(comm, attempt([&] { save_shard<T>(prefix, comm.rank(), comm.size(), id, at, master, state); }),
                errc::cancelled, "could not write its shard of " + prefix + " (" + who + ")", gather);
  all_succeeded(comm, attempt([&] {
                  if (comm.rank() == 0) save_manifest(prefix, comm.size(), at.steps);
                }),
                errc::cancelled, "could not write the manifest of " + prefix + " (" + who + ")", gather);
}

/// A trainer's `save` over `backend`'s memory: this rank's `master` slices and their `state` go
/// through host copies; under hybrid sharding the first replica's group writes, and every replica
/// learns whether it did. Collective over `comm` and `replicas`.
template <class T, class Backend, class Collective, class Replicas, class Span>
void save_trainer_shards(Backend& backend, Collective& comm, Replicas& replicas, const std::string& who,
                         const std::string& prefix, const shard_identity& id, const shard_state& at, Span master,
                         Span state) {
  const auto gather = gather_through(backend);
  auto write = [&] {
    const std::vector<T> m = backend.template to_host<T>(master), s = backend.template to_host<T>(state);
    save_sharded<T>(comm, gather, who, prefix, id, at, std::span<const T>(m), std::span<const T>(s));
  };
  if constexpr (std::same_as<Replicas, no_replicas>) {
    write();
  } else {
    std::exception_ptr failure;
    if (replicas.rank() == 0) {
      try {
        write();
      } catch (const error&) {
        failure = std::current_exception();
      }
    }
    all_succeeded(replicas, failure, errc::cancelled, "of the replicas could not save its group's set", gather);
  }
}

/// A trainer's `load` over `backend`'s memory: every rank reads its new slices (for its layout,
/// zeros where its slices are padding) into `master` and `state`; all succeed or all throw, and
/// then nothing is written. Collective. @throws dtrain::error `bad_data` (or the system error)
///   naming the file and the fault on a rank that could not load, and naming that rank on the
///   others.
template <class T, class Backend, class Collective, class Span>
shard_state load_trainer_shards(Backend& backend, Collective& comm, const std::string& who, const std::string& prefix,
                                const shard_identity& id, Span master, Span state) {
  std::vector<T> new_master(master.size(), T(0)), new_state(state.size(), T(0));
  shard_state at;
  std::exception_ptr failure;
  try {
    at = load_shards<T>(prefix, comm.rank(), comm.size(), id, std::span<T>(new_master), std::span<T>(new_state));
  } catch (const error&) {
    failure = std::current_exception();
  }
  all_succeeded(comm, failure, errc::bad_data, "could not load its shards of " + prefix + " (" + who + ")",
                gather_through(backend));
  backend.template from_host<T>(master, std::span<const T>(new_master));
  backend.template from_host<T>(state, std::span<const T>(new_state));
  return at;
}

}  // namespace dtrain::sharded
