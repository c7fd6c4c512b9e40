#pragma once
/// @file
/// `transport_buffer_forms<Derived>`: the one-buffer forms of a transport's `isend` and `irecv`
/// (see the `transport` concept), each written once over the gathered and scattered forms every
/// transport implements. A transport derives from it and brings the names in with `using`.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "dtrain/concepts/transport.hpp"
#include "dtrain/core/signature.hpp"

namespace dtrain {

template <class Derived>
class transport_buffer_forms {
 public:
  /// Starts sending `bytes` to `peer` on `tag`. @pre 0 <= peer < size()
  auto isend(int peer, std::uint64_t tag, const signature& sig, std::span<const std::byte> bytes) {
    const std::span<const std::byte> one[1] = {bytes};
    return self().isend(peer, tag, sig, gather_list(one));
  }

  /// Starts receiving from `peer` (or `any_peer`) on `tag` into `buffer`.
  auto irecv(int peer, std::uint64_t tag, std::span<std::byte> buffer) {
    const std::span<std::byte> one[1] = {buffer};
    return self().irecv(peer, tag, scatter_list(one), nullptr);
  }

  /// Starts receiving from `peer` (or `any_peer`) on `tag`, resizing `buffer` to the message.
  auto irecv(int peer, std::uint64_t tag, std::vector<std::byte>& buffer) {
    return self().irecv(peer, tag, scatter_list{}, &buffer);
  }

 private:
  Derived& self() noexcept { return static_cast<Derived&>(*this); }
};

}  // namespace dtrain
