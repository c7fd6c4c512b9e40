#pragma once
/// @file
/// `ps::table<T, Updater, Initializer>`: one server shard's parameters. Each key holds a run of
/// values (one weight of a sparse model, an embedding row, or a whole slice of a dense tensor),
/// created on first touch by the initializer, with the updater's per-parameter state beside
/// it. Pushed gradients go through the updater with their measured staleness; in summation
/// mode pushed values are added instead (the optimizer runs on the workers, as in BytePS).

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dtrain/concepts/initializer.hpp"
#include "dtrain/concepts/updater.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/hash.hpp"
#include "dtrain/detail/flat_map.hpp"
#include "dtrain/ps/key_cache.hpp"
#include "dtrain/ps/sharding.hpp"

namespace dtrain::ps {

/// New keys start at zero.
struct zero_initializer {
  static constexpr std::string_view name = "zero";
  template <std::floating_point T>
  void operator()(key_type, std::span<T> values) const noexcept {
    std::fill(values.begin(), values.end(), T(0));
  }
};

/// New keys start uniform in [-scale, scale], drawn from a hash of (seed, key, index): a key's
/// initial values do not depend on which keys came first, so a restarted or resharded server
/// initialises exactly as the first one did.
struct uniform_initializer {
  static constexpr std::string_view name = "uniform";
  double scale = 0.01;
  std::uint64_t seed = 0;

  template <std::floating_point T>
  void operator()(key_type key, std::span<T> values) const noexcept {
    for (std::size_t j = 0; j < values.size(); ++j) {
      const std::uint64_t h = splitmix64(seed ^ splitmix64(key) ^ (j * 0xd1b54a32d192ed03ull));
      const double u = static_cast<double>(h >> 11) * 0x1.0p-53;  // [0, 1)
      values[j] = static_cast<T>(scale * (2.0 * u - 1.0));
    }
  }
};

/// How a table applies what workers push.
enum class apply_mode {
  update,  ///< pushed values are gradients; the updater steps the parameters
  sum,     ///< pushed values are added to the parameters (the optimizer runs on the workers)
};

/// One shard's keys, values and updater state. Not thread-safe: the server serialises access.
template <std::floating_point T, updater<T> Updater, initializer<T> Initializer = zero_initializer>
class table {
  static_assert(!requires(const typename Updater::rule_type& r) { r.for_step(std::uint64_t{1}); },
                "a parameter server's keys are updated at their own rates: use lazy_adam (a step count per "
                "parameter) rather than adam or adamw (a step count per tensor)");

 public:
  using value_type = T;

  explicit table(Updater u, Initializer init = {}, apply_mode mode = apply_mode::update)
      : updater_(std::move(u)), init_(std::move(init)), mode_(mode) {}

  /// Applies pushed values for `keys`, each with `length` values (a key's length is fixed at
  /// its first touch). `info.staleness` reaches the updater.
  /// @throws dtrain::error `invalid_argument` if the sizes disagree or a key changes length
  void push(std::span<const key_type> keys, std::span<const T> values, std::size_t length, step_info info = {},
            resolved_keys* resolved = nullptr) {
    check_sizes(keys, values.size(), length, "push");
    for_each_slot(keys, length, resolved,
                  [&](std::size_t i, std::uint32_t s) { apply(s, values.subspan(i * length, length), info); });
    ++pushes_;
  }

  /// Copies the values of `keys` into `out` (keys.size() * length), creating unseen keys.
  void pull(std::span<const key_type> keys, std::span<T> out, std::size_t length, resolved_keys* resolved = nullptr) {
    check_sizes(keys, out.size(), length, "pull");
    for_each_slot(keys, length, resolved, [&](std::size_t i, std::uint32_t s) {
      copy_out(s, length, out.data() + i * length);
    });
  }

  /// `push`, then `pull` of the same keys, in one pass: each key is found once and its new
  /// values are copied out while they are still in cache.
  void push_pull(std::span<const key_type> keys, std::span<const T> values, std::span<T> out, std::size_t length,
                 step_info info = {}, resolved_keys* resolved = nullptr) {
    check_sizes(keys, values.size(), length, "push");
    check_sizes(keys, out.size(), length, "pull");
    for_each_slot(keys, length, resolved, [&](std::size_t i, std::uint32_t s) {
      apply(s, values.subspan(i * length, length), info);
      copy_out(s, length, out.data() + i * length);
    });
    ++pushes_;
  }

  /// Keys held.
  std::size_t size() const noexcept { return keys_.size(); }
  /// Parameters held (sum of the keys' lengths).
  std::size_t parameters() const noexcept { return values_.size(); }
  /// Pushes applied so far.
  std::uint64_t pushes() const noexcept { return pushes_; }
  apply_mode mode() const noexcept { return mode_; }
  Updater& updater() noexcept { return updater_; }
  const Initializer& initializer_policy() const noexcept { return init_; }

  /// Calls `f(key, values, state)` for every key in the order keys were created (checkpoints).
  template <class F>
  void for_each(F&& f) {
    auto state = updater_.state();
    const std::size_t slots = Updater::state_slots;
    for (std::size_t s = 0; s < keys_.size(); ++s) {
      const std::size_t len = length_of(s);
      f(keys_[s], std::span<T>(values_.data() + offset_[s], len), state.subspan(offset_[s] * slots, len * slots));
    }
  }

  /// Re-creates `key` with the given values and updater state (restoring a checkpoint).
  /// @throws dtrain::error `bad_data` if the key exists or the state has the wrong size
  void restore(key_type key, std::span<const T> values, std::span<const T> state) {
    if (map_.find(key) != dtrain::detail::flat_key_map::none) {
      throw error(errc::bad_data, "ps::table: key " + std::to_string(key) + " appears twice in the checkpoint");
    }
    if (state.size() != values.size() * Updater::state_slots) {
      throw error(errc::bad_data, "ps::table: key " + std::to_string(key) + " has " + std::to_string(state.size()) +
                                      " state values, expected " +
                                      std::to_string(values.size() * Updater::state_slots));
    }
    const std::uint32_t s = create(key, values.size(), /*initialise=*/false);
    std::copy(values.begin(), values.end(), values_.begin() + static_cast<std::ptrdiff_t>(offset_[s]));
    auto st = updater_.state().subspan(offset_[s] * Updater::state_slots, state.size());
    std::copy(state.begin(), state.end(), st.begin());
  }

 private:
  static constexpr std::size_t prefetch_distance = 16;  // keys looked up ahead of the one in hand

  void check_sizes(std::span<const key_type> keys, std::size_t values, std::size_t length, const char* op) const {
    if (length == 0 || values != keys.size() * length) {
      throw error(errc::invalid_argument, std::string("ps::table ") + op + ": " + std::to_string(keys.size()) +
                                              " keys of length " + std::to_string(length) + " but " +
                                              std::to_string(values) + " values");
    }
  }

  // Calls f(i, slot of keys[i]) in order, creating unseen keys, with the hash probes (or the
  // values) of later keys prefetched. `resolved`, when given, is used if filled, else filled.
  template <class F>
  void for_each_slot(std::span<const key_type> keys, std::size_t length, resolved_keys* resolved, F&& f) {
    if (resolved != nullptr && resolved->slots.size() == keys.size()) {
      const std::uint32_t* slots = resolved->slots.data();
      for (std::size_t i = 0; i < keys.size(); ++i) {
        if (i + prefetch_distance < keys.size())
          __builtin_prefetch(values_.data() + offset_[slots[i + prefetch_distance]]);
        f(i, slots[i]);
      }
      return;
    }
    if (resolved != nullptr) resolved->slots.clear();
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (i + prefetch_distance < keys.size()) map_.prefetch(keys[i + prefetch_distance]);
      const std::uint32_t s = slot_for(keys[i], length);
      if (resolved != nullptr) resolved->slots.push_back(s);
      f(i, s);
    }
  }

  void apply(std::uint32_t s, std::span<const T> in, step_info info) {
    std::span<T> params(values_.data() + offset_[s], in.size());
    if (mode_ == apply_mode::update) {
      updater_.step(params, in, offset_[s], info);
    } else {
      for (std::size_t j = 0; j < in.size(); ++j) params[j] += in[j];
    }
  }

  // A key's values into a reply. Sparse keys mostly hold one value, where a call to memmove per
  // key (what copy_n becomes) cost more than the update itself.
  void copy_out(std::uint32_t s, std::size_t length, T* to) const noexcept {
    const T* from = values_.data() + offset_[s];
    if (length == 1) {
      *to = *from;
    } else {
      std::copy_n(from, length, to);
    }
  }

  std::size_t length_of(std::size_t s) const noexcept {
    return (s + 1 < offset_.size() ? offset_[s + 1] : values_.size()) - offset_[s];
  }

  std::uint32_t slot_for(key_type key, std::size_t length) {
    std::uint32_t s = map_.find(key);
    if (s == dtrain::detail::flat_key_map::none) return create(key, length, true);
    if (length_of(s) != length) {
      throw error(errc::invalid_argument, "ps::table: key " + std::to_string(key) + " holds " +
                                              std::to_string(length_of(s)) + " values, not " + std::to_string(length));
    }
    return s;
  }

  std::uint32_t create(key_type key, std::size_t length, bool initialise) {
    const auto s = static_cast<std::uint32_t>(keys_.size());
    if (s == dtrain::detail::flat_key_map::none)
      throw error(errc::invalid_argument, "ps::table: more than 2^32 - 1 keys");
    keys_.push_back(key);
    offset_.push_back(values_.size());
    values_.resize(values_.size() + length);
    updater_.resize(values_.size());
    if (initialise) init_(key, std::span<T>(values_.data() + offset_[s], length));
    map_.insert(key, s);
    return s;
  }

  Updater updater_;
  Initializer init_;
  apply_mode mode_;
  dtrain::detail::flat_key_map map_;
  std::vector<key_type> keys_;
  std::vector<std::size_t> offset_;  // per slot: first value
  std::vector<T> values_;
  std::uint64_t pushes_ = 0;
};

}  // namespace dtrain::ps
