#pragma once
/// @file
/// How the ranks of a sharded trainer agree before they go on: on what they built (named values
/// every rank compares), and on whether every rank managed a step that can fail on one of them
/// alone (writing or reading a checkpoint). Every rank raises the same error, instead of some
/// going on into a collective the others never reach.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/reduce_op.hpp"
#include "dtrain/detail/agreed_fields.hpp"
#include "dtrain/sharded/options.hpp"
#include "dtrain/updater/loss_scaler.hpp"

namespace dtrain::sharded {

/// Every rank of `comm` and, under hybrid sharding, of `replicas` gathers every rank's values
/// of `fields` (through `backend`'s memory: `allgather_digests`); if any rank's differ from rank
/// 0's, raises `invalid_argument`: "<who>: ranks disagree on <what>: <field>: rank 0 has ...,
/// rank r has ...". Every rank sees the same values, so all raise it.
template <class Backend, class Collective, class Replicas>
void check_agreement(Backend& backend, Collective& comm, Replicas& replicas,
                     std::span<const dtrain::detail::agreed_field> fields, const std::string& who,
                     const std::string& what) {
  const std::vector<std::int64_t> mine = dtrain::detail::values_of(fields);
  auto check = [&](const std::vector<std::int64_t>& all, const std::string& where) {
    const std::string disagreement = dtrain::detail::field_disagreement(fields, all);
    if (disagreement.empty()) return;
    throw error(errc::invalid_argument, where + ": ranks disagree on " + what + ": " + disagreement);
  };
  check(backend.allgather_digests(comm, std::span<const std::int64_t>(mine)), who);
  if constexpr (detail::has_replicas<Replicas>) {
    check(backend.allgather_digests(replicas, std::span<const std::int64_t>(mine)), who + " across replicas");
  }
}

/// Gathers as `backend` does (`allgather_digests`: through device memory for a device backend).
template <class Backend>
auto gather_through(Backend& backend) {
  return [&backend](auto& comm, std::span<const std::int64_t> mine) { return backend.allgather_digests(comm, mine); };
}

/// After every rank of `comm` has tried something: rethrows this rank's `failure`, else raises
/// `code` with `what` and the first rank that failed ("rank 2 could not ..."). Collective:
/// `gather(comm, mine)` is every rank's `mine`, in rank order (`detail::allgather_on_host`, or
/// a backend's `allgather_digests`: `gather_through(backend)`).
template <class Collective, class Gather>
void all_succeeded(Collective& comm, std::exception_ptr failure, errc code, const std::string& what, Gather&& gather) {
  const std::int64_t mine = failure ? 0 : 1;
  const std::vector<std::int64_t> all = gather(comm, std::span<const std::int64_t>(&mine, 1));
  if (failure) std::rethrow_exception(failure);
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r] == 0) throw error(code, "rank " + std::to_string(r) + " " + what);
  }
}

/// `dtrain::keep_step` (updater/loss_scaler.hpp) over `comm` and, under hybrid sharding, `replicas`.
template <class Collective, class Replicas, class T>
bool keep_step(Collective& comm, Replicas& replicas, loss_scaler& scaler, std::span<T> slice) {
  if constexpr (detail::has_replicas<Replicas>) {
    return dtrain::keep_step(scaler, slice, comm, replicas);
  } else {
    return dtrain::keep_step(scaler, slice, comm);
  }
}

}  // namespace dtrain::sharded
