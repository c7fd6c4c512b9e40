#pragma once
/// @file
/// `device_mesh<World>`: the world's ranks laid out on named axes, with this rank's coordinates
/// and its process group along each axis (PyTorch's DeviceMesh, Megatron's parallel state).
///
/// Rank order: the last axis is innermost. With axes {"dp", "pp", "tp"} of sizes {D, P, T},
/// world rank = (dp * P + pp) * T + tp, so a tensor-parallel group is T consecutive ranks (one
/// host, when hosts hold consecutive ranks as launchers place them), a pipeline's stages are T
/// apart, and data-parallel replicas P * T apart.
///
/// <!-- frame: header_tcp_world -->
/// @code
/// dtrain::device_mesh mesh(dtrain::process_group(std::move(world)), {{"dp", 2}, {"pp", 2}, {"tp", 2}});
/// auto& tp = mesh.group("tp");   // a transport: ring<process_group<...>> c(tp) reduces over it
/// int stage = mesh.coordinate("pp");
/// @endcode

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dtrain/concepts/transport.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/transport/group.hpp"
#include "dtrain/transport/rank_list.hpp"

namespace dtrain {

/// One axis of a mesh: its name and how many ranks lie along it.
struct mesh_axis {
  std::string name;
  int size = 1;
};

template <transport World>
class device_mesh {
 public:
  using group_type = process_group<World>;

  /// Lays `world`'s ranks out on `axes`. Local: no messages (each axis group is formed by name).
  /// @throws dtrain::error `invalid_argument` if the sizes' product is not the world size, an
  ///   axis is smaller than 1, or two axes share a name.
  device_mesh(process_group<World> world, std::vector<mesh_axis> axes)
      : world_(std::move(world)), axes_(std::move(axes)) {
    long long product = 1;
    for (std::size_t a = 0; a < axes_.size(); ++a) {
      if (axes_[a].size < 1) throw bad("axis '" + axes_[a].name + "' has size " + std::to_string(axes_[a].size));
      for (std::size_t b = 0; b < a; ++b) {
        if (axes_[b].name == axes_[a].name) throw bad("two axes are named '" + axes_[a].name + "'");
      }
      product *= axes_[a].size;
    }
    if (product != world_.size()) {
      throw bad("the axes hold " + std::to_string(product) + " ranks but the group has " +
                std::to_string(world_.size()));
    }
    coordinates_ = coordinates_of(world_.rank());
    for (std::size_t a = 0; a < axes_.size(); ++a) groups_.push_back(form_axis_group(a));
  }

  const std::vector<mesh_axis>& axes() const noexcept { return axes_; }
  group_type& world() noexcept { return world_; }

  /// This rank's coordinate along `axis`. @throws dtrain::error `invalid_argument` for no such axis
  int coordinate(std::string_view axis) const { return coordinates_[index_of(axis)]; }
  const std::vector<int>& coordinates() const noexcept { return coordinates_; }

  /// The ranks that differ from this one only along `axis`, ordered by their coordinate there.
  group_type& group(std::string_view axis) { return groups_[index_of(axis)]; }

  /// The rank (in the mesh's world group) at `coords`, one per axis.
  int rank_at(std::span<const int> coords) const {
    if (coords.size() != axes_.size()) throw bad("rank_at takes one coordinate per axis");
    int r = 0;
    for (std::size_t a = 0; a < axes_.size(); ++a) {
      if (coords[a] < 0 || coords[a] >= axes_[a].size) {
        throw bad("coordinate " + std::to_string(coords[a]) + " is outside axis '" + axes_[a].name + "'");
      }
      r = r * axes_[a].size + coords[a];
    }
    return r;
  }

  /// The coordinates of rank `r` (in the mesh's world group).
  std::vector<int> coordinates_of(int r) const {
    std::vector<int> c(axes_.size());
    for (std::size_t a = axes_.size(); a-- > 0;) {
      c[a] = r % axes_[a].size;
      r /= axes_[a].size;
    }
    return c;
  }

 private:
  static error bad(const std::string& what) { return error(errc::invalid_argument, "device_mesh: " + what); }

  std::size_t index_of(std::string_view axis) const {
    for (std::size_t a = 0; a < axes_.size(); ++a) {
      if (axes_[a].name == axis) return a;
    }
    throw bad("no axis named '" + std::string(axis) + "'");
  }

  // This rank's group along axis a, named by the axis and the other coordinates, so every
  // group of the mesh (size-one ones too) has a tag space of its own.
  group_type form_axis_group(std::size_t a) const {
    std::vector<int> coords = coordinates_;
    std::vector<int> members;
    std::string label = "mesh:" + axes_[a].name;  // "mesh:tp@dp0,pp1"; a one-axis mesh's "mesh:dp"
    const char* separator = "@";
    for (std::size_t b = 0; b < axes_.size(); ++b) {
      if (b == a) continue;
      label += separator + axes_[b].name + std::to_string(coords[b]);
      separator = ",";
    }
    for (int i = 0; i < axes_[a].size; ++i) {
      coords[a] = i;
      members.push_back(world_.world_rank(rank_at(coords)));
    }
    return *world_.form(rank_list(std::move(members)), label);
  }

  group_type world_;
  std::vector<mesh_axis> axes_;
  std::vector<int> coordinates_;
  std::vector<group_type> groups_;  // one per axis
};

}  // namespace dtrain
