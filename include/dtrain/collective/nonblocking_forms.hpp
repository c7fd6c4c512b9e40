#pragma once
/// @file
/// The nonblocking (`i`) forms of a host communicator's collectives: each queues the blocking
/// call of the same name on the communicator's thread and returns a `collective_request` at
/// once (MPI_Iallreduce, PyTorch's `async_op=True`). They run in the order they were started, so
/// every rank must start them in the same order, as with the blocking forms; they may be waited
/// for in any order. Buffers must stay alive and untouched until the request completes;
/// argument errors are raised by `wait`.

#include <cstddef>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtrain/collective/request.hpp"
#include "dtrain/concepts/element.hpp"
#include "dtrain/core/reduce_op.hpp"

namespace dtrain::detail {

/// The `i` forms of `Derived`, which befriends this class for its `submit`.
template <class Derived>
class nonblocking_forms {
 public:
  template <element T>
  collective_request ibroadcast(std::span<T> buf, int root) {
    return later([=](Derived& c) { c.template broadcast<T>(buf, root); });
  }
  /// `Op` is a `reduce_op` or a `user_op`.
  template <element T, class Op>
  collective_request ireduce(std::type_identity_t<std::span<const T>> in, std::span<T> out, Op op, int root) {
    return later([=](Derived& c) { c.template reduce<T>(in, out, op, root); });
  }
  template <element T, class Op>
  collective_request iallreduce(std::type_identity_t<std::span<const T>> in, std::span<T> out, Op op) {
    return later([=](Derived& c) { c.template allreduce<T>(in, out, op); });
  }
  template <element T, class Op>
  collective_request iallreduce(std::span<T> buf, Op op) {
    return later([=](Derived& c) { c.template allreduce<T>(buf, op); });
  }
  template <element T, class Op>
  collective_request ireduce_scatter(std::type_identity_t<std::span<const T>> in, std::span<T> out, Op op) {
    return later([=](Derived& c) { c.template reduce_scatter<T>(in, out, op); });
  }
  template <element T>
  collective_request iallgather(std::type_identity_t<std::span<const T>> in, std::span<T> out) {
    return later([=](Derived& c) { c.template allgather<T>(in, out); });
  }
  template <element T>
  collective_request igather(std::type_identity_t<std::span<const T>> in, std::span<T> out, int root) {
    return later([=](Derived& c) { c.template gather<T>(in, out, root); });
  }
  template <element T>
  collective_request iscatter(std::type_identity_t<std::span<const T>> in, std::span<T> out, int root) {
    return later([=](Derived& c) { c.template scatter<T>(in, out, root); });
  }
  template <element T>
  collective_request ialltoall(std::type_identity_t<std::span<const T>> in, std::span<T> out) {
    return later([=](Derived& c) { c.template alltoall<T>(in, out); });
  }
  /// The count lists are copied: only the data buffers must outlive the request.
  template <element T>
  collective_request iallgatherv(std::type_identity_t<std::span<const T>> in, std::span<T> out,
                                 std::span<const std::size_t> counts) {
    return later([=, n = owned(counts)](Derived& c) { c.template allgatherv<T>(in, out, n); });
  }
  template <element T, class Op>
  collective_request ireduce_scatterv(std::type_identity_t<std::span<const T>> in, std::span<const std::size_t> counts,
                                      std::span<T> out, Op op) {
    return later([=, n = owned(counts)](Derived& c) { c.template reduce_scatterv<T>(in, n, out, op); });
  }
  template <element T>
  collective_request ialltoallv(std::type_identity_t<std::span<const T>> in, std::span<const std::size_t> send_counts,
                                std::span<T> out, std::span<const std::size_t> recv_counts) {
    return later([=, s = owned(send_counts), r = owned(recv_counts)](Derived& c) {
      c.template alltoallv<T>(in, s, out, r);
    });
  }
  collective_request ibarrier() {
    return later([](Derived& c) { c.barrier(); });
  }

 private:
  template <class F>
  collective_request later(F body) {
    Derived& c = static_cast<Derived&>(*this);
    return c.calls_.submit([&c, body = std::move(body)] { body(c); });
  }
  static std::vector<std::size_t> owned(std::span<const std::size_t> s) { return {s.begin(), s.end()}; }
};

}  // namespace dtrain::detail
