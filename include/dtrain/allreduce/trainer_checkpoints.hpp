#pragma once
/// @file
/// `allreduce::trainer_checkpoints<Trainer>`: the allreduce trainer's `save` and `load`, a CRTP
/// part of `basic_trainer` (basic_trainer.hpp). A checkpoint holds this rank's parameters,
/// updater state, step count, learning rate, loss scale and data position, with the identity
/// (updater, world size, rank, bucket plan digest, tensor sizes) a file must match to load; the
/// file format is allreduce/checkpoint.hpp's.

#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <vector>

#include "dtrain/allreduce/checkpoint.hpp"
#include "dtrain/allreduce/trainer_options.hpp"
#include "dtrain/core/error.hpp"

namespace dtrain::allreduce {

template <class Trainer>
class trainer_checkpoints {
 public:
  /// Writes this rank's parameters, updater state, step count and learning rate, with `at`
  /// (where this rank is in its data), to `path` atomically. Call between steps. During
  /// synchronous training the replicas are identical and any rank's file restores every rank;
  /// during local SGD each rank needs its own. Local: no communication.
  /// On the device the tensors go through host copies, after the updates enqueued so far: the file
  /// is the same, and loads on either memory.
  /// @throws dtrain::error `invalid_argument` after an `accumulate` whose `step` has not run, and
  ///   the system error when the file cannot be written.
  void save(const std::string& path, data::sampler_position at = {}) {
    Trainer& t = self();
    using master_type = typename Trainer::master_type;
    if (t.accumulated_ > 0) {
      throw error(errc::invalid_argument, t.name() + ": save between steps, not between accumulate and step");
    }
    std::vector<std::vector<master_type>> copies;
    for (std::size_t i = 0; i < t.plan_.tensor_count(); ++i) copies.push_back(on_host(t.backend_.master(t.model_, i)));
    const std::vector<std::span<master_type>> params(copies.begin(), copies.end());
    const checkpoint_state state{t.steps_, t.updater_.learning_rate(), at, t.scaler_.scale(), t.scaler_.good_steps()};
    save_allreduce_checkpoint<master_type>(path, identity(), state, params,
                                           std::span<const master_type>(on_host(t.updater_.state())));
  }

  /// Restores what `save` wrote, so the next `step` continues that job bit for bit; returns the
  /// data position saved with it. Collective: every rank loads (its own file, or under
  /// synchronous training any rank's), and all check that all succeeded at the same step.
  /// @throws dtrain::error `bad_data` naming the file and what does not match (model, world
  ///   size, updater, options, rank) or that it is corrupt, on the rank that read it, and on
  ///   every other rank an error naming that rank; nothing is changed on any rank then.
  data::sampler_position load(const std::string& path) {
    Trainer& t = self();
    using master_type = typename Trainer::master_type;
    std::vector<master_type> params(t.plan_.elements()), state(t.updater_.state().size());
    checkpoint_state at;
    std::exception_ptr failure;
    try {
      at = load_allreduce_checkpoint<master_type>(path, identity(), std::span(params), std::span(state));
    } catch (const error&) {
      failure = std::current_exception();
    }
    // Every rank learns whether every rank read a good file for the same step.
    const std::vector<std::int64_t> mine{failure ? 0 : 1, static_cast<std::int64_t>(at.steps)};
    std::vector<std::int64_t> all;
    t.with_collective([&](auto& c) { all = t.backend_.allgather_digests(c, std::span<const std::int64_t>(mine)); });
    if (failure) std::rethrow_exception(failure);
    if (const std::string fault = detail::load_disagreement(all); !fault.empty()) {
      throw error(errc::bad_data, t.name() + ": " + fault);
    }
    for (std::size_t i = 0; i < t.plan_.tensor_count(); ++i) {
      from_host(t.backend_.master(t.model_, i),
                std::span<const master_type>(params).subspan(t.plan_.parameter_offset(i), t.plan_.tensor_size(i)));
      t.backend_.publish(t.model_, i);
    }
    from_host(t.updater_.state(), std::span<const master_type>(state));
    t.updater_.set_learning_rate(at.learning_rate);
    t.scaler_.restore(at.loss_scale, at.good_steps);
    t.steps_ = at.steps;
    return at.position;
  }

 private:
  Trainer& self() noexcept { return static_cast<Trainer&>(*this); }

  // A checkpoint's host copy of `s` (the backend's: on the device, after the updates enqueued).
  template <class S>
  auto on_host(S s) {
    return self().backend_.download(self().model_, s);
  }
  template <class S, class T>
  void from_host(S s, std::span<const T> v) {
    self().backend_.upload(self().model_, s, v);
  }

  // What this rank's checkpoint must match.
  checkpoint_identity identity() {
    const Trainer& t = self();
    using updater = typename Trainer::updater_policy;
    const auto& o = t.options_;
    checkpoint_identity id{std::string(updater::name), static_cast<std::uint32_t>(updater::state_slots),
                           static_cast<std::uint32_t>(sizeof(typename Trainer::master_type)),
                           static_cast<std::uint32_t>(t.comm_.size()), static_cast<std::uint32_t>(t.comm_.rank()), true,
                           static_cast<std::uint64_t>(detail::digest_of(t.plan_, t.contiguous_, o)[3]), {}};
    // During local SGD the replicas differ, except right after an averaging.
    id.replicas_identical = !t.local_sgd_now() || (t.steps_ - o.local_sgd_after) % o.average_every == 0;
    for (std::size_t i = 0; i < t.plan_.tensor_count(); ++i) id.sizes.push_back(t.plan_.tensor_size(i));
    return id;
  }
};

}  // namespace dtrain::allreduce
