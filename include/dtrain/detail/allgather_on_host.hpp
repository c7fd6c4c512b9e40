#pragma once
/// @file
/// `detail::allgather_on_host`: every rank's few values (a start-up digest, a shape, a verdict),
/// gathered in rank order through host memory, as the trainers and layers compare them.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace dtrain::detail {

/// Every rank's `mine`, in rank order, over `comm` (a collective of host memory). Collective.
template <class Collective>
std::vector<std::int64_t> allgather_on_host(Collective& comm, std::span<const std::int64_t> mine) {
  std::vector<std::int64_t> all(mine.size() * static_cast<std::size_t>(comm.size()));
  comm.allgather(mine, std::span<std::int64_t>(all));
  return all;
}

}  // namespace dtrain::detail
