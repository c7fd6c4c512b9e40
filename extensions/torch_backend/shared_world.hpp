#pragma once
// The connections a process's dtrain groups share. The first dtrain group formed in a process
// opens a world transport of its ranks: shared memory to the ranks on this host, TCP to the
// others (`mixed_transport`, the path decided per peer from each rank's host, as under
// dtrain-run). A later group (`new_group`, DeviceMesh's sub-groups) whose members all belong to
// that world is a `process_group` on it: a rank map and a tag space, no new connection. A group
// whose members do not share one world (the default group is Gloo's and two dtrain groups were
// formed apart) opens a world of its own, which later groups may then share.

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <memory>

#include "dtrain/transport/group.hpp"
#include "dtrain/transport/mixed.hpp"

namespace dtrain::torch_backend {

using group_transport = process_group<mixed_transport>;

/// A world transport, and the number that tells it from another world's (the same on its ranks).
struct shared_world {
  std::uint64_t id = 0;
  group_transport world;
};

/// The transport of a group of `size` ranks meeting in `store`, this rank `rank`: a group of the
/// process's shared world where every member is in it, else a new world (the shared one from
/// then on, if this process has none alive). `home` keeps that world alive as long as the caller
/// holds it. Every member calls it at once (it meets the others in `store`).
/// @throws dtrain::error naming the rank or step that did not arrive within `timeout`
group_transport form_group(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                           std::chrono::milliseconds timeout, std::shared_ptr<shared_world>& home);

}  // namespace dtrain::torch_backend
