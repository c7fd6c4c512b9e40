#pragma once
/// @file
/// `pipeline::link<Link, T>`: how the pipeline executor keeps activations of `T` and moves them
/// between neighbouring stages over `Link`. Here for a host `transport` (activations in vectors,
/// sent as bytes with their signature); pipeline/device_link.hpp adds point-to-point
/// communicators of device memory (`staged_communicator`), so the one executor runs both.
///
/// A link provides, for the executor only: `buffer` (owned activations) with `resize` and `view`;
/// `isend(link, peer, tag, sig, values)` and `irecv(link, peer, tag, values)` returning a
/// `completion` whose `info().sig` is the sender's signature; `mismatch`, the error a receive of
/// another size ends with before the executor compares signatures; `copy` and `swap` of spans
/// (weight stashing); `zero` and `scale` of a span (the trainer's gradients); `to_host` and
/// `from_host` (the handshake, the trainer's checkpoints); `current_device` and `use_device` (the
/// trainer's communication thread works on the device it was built on).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "dtrain/concepts/transport.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/signature.hpp"

namespace dtrain::pipeline {

template <class Link, class T>
struct link;

/// A host transport: activations in `std::vector`s, messages of bytes.
template <transport Transport, class T>
struct link<Transport, T> {
  using buffer = std::vector<T>;
  using span = std::span<T>;
  using const_span = std::span<const T>;
  static constexpr errc mismatch = errc::message_truncated;

  static void resize(buffer& b, std::size_t n) { b.resize(n); }
  static span view(buffer& b) noexcept { return b; }
  static auto isend(Transport& t, int peer, std::uint64_t tag, const signature& sig, const_span values) {
    return t.isend(peer, tag, sig, std::as_bytes(values));
  }
  static auto irecv(Transport& t, int peer, std::uint64_t tag, span values) {
    return t.irecv(peer, tag, std::as_writable_bytes(values));
  }
  static void copy(span dst, const_span src) { std::copy(src.begin(), src.end(), dst.begin()); }
  static void swap(span a, span b, buffer&) { std::swap_ranges(a.begin(), a.end(), b.begin()); }
  static void zero(span s) { std::fill(s.begin(), s.end(), T(0)); }
  static void scale(span s, T factor) {
    for (T& x : s) x *= factor;
  }
  static std::vector<T> to_host(const_span s) { return {s.begin(), s.end()}; }
  static void from_host(span s, std::span<const T> host) { std::copy(host.begin(), host.end(), s.begin()); }
  static int current_device() noexcept { return 0; }
  static void use_device(int) noexcept {}
};

}  // namespace dtrain::pipeline
