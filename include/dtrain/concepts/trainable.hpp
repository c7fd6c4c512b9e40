#pragma once
/// @file
/// The `trainable` concept: the parts an allreduce trainer is built from fit one another.

#include <cstdint>

#include "dtrain/concepts/collective.hpp"
#include "dtrain/concepts/updater.hpp"

namespace dtrain {

/// `Collective`, `Updater` and `Model` make an allreduce trainer:
///  1. `Collective` reduces and broadcasts the model's `value_type` (gradients, parameters),
///  2. and gathers `std::int64_t` (every rank's plan digest, compared at start-up);
///  3. `Updater` updates parameters of the value type's compute type (`float` for a 16-bit model:
///     its master copy), which `Collective` reduces too.
/// Where the tensors live (host or device memory) is the trainer's backend's business.
template <class Collective, class Updater, class Model>
concept trainable = collective<Collective, typename Model::value_type> && collective<Collective, std::int64_t> &&
                    collective<Collective, compute_type_t<typename Model::value_type>> &&
                    updater<Updater, compute_type_t<typename Model::value_type>>;

}  // namespace dtrain
