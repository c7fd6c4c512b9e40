#include "shared_world.hpp"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/core/deadline.hpp"
#include "dtrain/core/hash.hpp"
#include "dtrain/rendezvous/store.hpp"
#include "store_adapter.hpp"

namespace dtrain::torch_backend {
namespace {

// The world later groups form on: the first one formed in this process that is still alive.
// Never freed: a group may outlive the static destructors that run at exit.
std::mutex& shared_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::weak_ptr<shared_world>& shared() {
  static auto* w = new std::weak_ptr<shared_world>;
  return *w;
}

// Rank 0 draws a number and shares it through the store; every member returns it.
std::string drawn_by_rank_zero(c10d_store& store, const std::string& key, int rank, deadline d) {
  if (rank == 0) {
    std::random_device entropy;
    std::string text;
    for (int i = 0; i < 4; ++i) text += std::to_string(entropy()) + ".";
    store.set(key, as_value(text), d);
    return text;
  }
  return value_text(get_published_by(store, key, "rank 0", d));
}

// Without a token of the user's, the connections prove they belong to this group with one rank 0
// drew (a stray process from another job is refused), as safe as the store itself, which is all
// c10d's own backends rely on.
group_transport open_world(c10d_store& store, int rank, int size, std::chrono::milliseconds timeout, deadline d) {
  mixed_options o;
  o.tcp.timeout = o.shm.timeout = timeout;
  if (std::getenv("DTRAIN_TOKEN") == nullptr && std::getenv("DTRAIN_TOKEN_FILE") == nullptr) {
    o.tcp.token = o.shm.token = drawn_by_rank_zero(store, "dtrain_torch/token", rank, d);
  }
  const char* master = std::getenv("MASTER_ADDR");  // a route to it names this host's address
  return group_transport(mixed_transport::connect(store, rank, size, o.with_environment(), master ? master : ""),
                         timeout);
}

}  // namespace

group_transport form_group(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                           std::chrono::milliseconds timeout, std::shared_ptr<shared_world>& home) {
  c10d_store meeting(store);
  const deadline d = deadline::after(timeout);
  std::shared_ptr<shared_world> world;
  {
    std::lock_guard lock(shared_mutex());
    world = shared().lock();
  }
  // Each member says which world it is in, and its rank there; the group forms on that world
  // only where every member names the same one.
  auto member_key = [](int r) { return "dtrain_torch/member/" + std::to_string(r); };
  const std::string mine = world ? std::to_string(world->id) + " " + std::to_string(world->world.world_rank()) : "none";
  meeting.set(member_key(rank), as_value(mine), d);
  std::vector<int> world_ranks;
  bool on_one_world = world != nullptr;
  for (int r = 0; r < size; ++r) {
    std::istringstream said(value_text(get_published_by(meeting, member_key(r), "rank " + std::to_string(r), d)));
    std::uint64_t id = 0;
    int world_rank = -1;
    on_one_world = on_one_world && (said >> id >> world_rank) && id == world->id;
    world_ranks.push_back(world_rank);
  }
  const std::uint64_t drawn = fnv1a().text(drawn_by_rank_zero(meeting, "dtrain_torch/group", rank, d)).value();
  if (on_one_world) {  // named in errors "rank 1 of group 'new_group 3f2a9c01' (world rank 4)"
    home = world;
    char name[32];
    std::snprintf(name, sizeof name, "new_group %08x", static_cast<unsigned>(drawn >> 32));
    return *world->world.form(rank_list(std::move(world_ranks)), name);
  }
  auto fresh = std::make_shared<shared_world>(shared_world{drawn, open_world(meeting, rank, size, timeout, d)});
  {
    std::lock_guard lock(shared_mutex());
    if (shared().expired()) shared() = fresh;
  }
  home = fresh;
  return fresh->world;
}

}  // namespace dtrain::torch_backend
