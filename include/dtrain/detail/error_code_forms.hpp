#pragma once
// The noexcept `std::error_code` forms of a collective's operations, each written once over its
// throwing form (Asio's pair: `f(..., ec) noexcept` beside a throwing `f(...)`). Every
// communicator (host, NCCL, staged) derives from `error_code_forms` and brings its names in with
// `using`, so a reader steps from any `ec` form into one function here.

#include <new>
#include <span>
#include <string>
#include <system_error>
#include <type_traits>

#include "dtrain/concepts/element.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/reduce_op.hpp"

namespace dtrain::detail {

/// `std::span` as a one-parameter template, for `error_code_forms`' buffer parameter.
template <class T>
using host_span = std::span<T>;

/// Runs `f`; what it throws becomes `ec`, and its text goes to `message` where there is one.
/// A `dtrain::error` (or any `std::system_error`) keeps its code; running out of memory is
/// `std::errc::not_enough_memory`; anything else is `errc::broken`.
template <class F>
void catch_into(std::error_code& ec, std::string* message, F&& f) noexcept {
  ec.clear();
  try {
    f();
    return;
  } catch (const std::system_error& e) {
    ec = e.code();
    if (message != nullptr) *message = e.what();
  } catch (const std::bad_alloc&) {
    ec = std::make_error_code(std::errc::not_enough_memory);
    if (message != nullptr) *message = "dtrain: out of memory";
  } catch (...) {
    ec = make_error_code(errc::broken);
    if (message != nullptr) *message = "dtrain: unexpected exception";
  }
}

/// The `error_code` forms of every operation of the collective `Derived`, whose buffers are
/// `Buffer<T>` (`host_span`, `device_span`, `thrust_buffer`). Each calls the throwing form of the
/// same name on `Derived`. A derived class that keeps the last error's text provides
/// `std::string* error_message() noexcept` (befriending this class); the default keeps none.
template <class Derived, template <class> class Buffer>
class error_code_forms {
 public:
  template <element T>
  void broadcast(Buffer<T> buf, int root, std::error_code& ec) noexcept {
    run(ec, [&] { self().template broadcast<T>(buf, root); });
  }
  template <element T>
  void reduce(std::type_identity_t<Buffer<const T>> in, Buffer<T> out, reduce_op op, int root,
              std::error_code& ec) noexcept {
    run(ec, [&] { self().template reduce<T>(in, out, op, root); });
  }
  template <element T>
  void reduce(Buffer<T> buf, reduce_op op, int root, std::error_code& ec) noexcept {
    run(ec, [&] { self().template reduce<T>(buf, op, root); });
  }
  template <element T>
  void allreduce(std::type_identity_t<Buffer<const T>> in, Buffer<T> out, reduce_op op, std::error_code& ec) noexcept {
    run(ec, [&] { self().template allreduce<T>(in, out, op); });
  }
  template <element T>
  void allreduce(Buffer<T> buf, reduce_op op, std::error_code& ec) noexcept {
    run(ec, [&] { self().template allreduce<T>(buf, op); });
  }
  template <element T>
  void reduce_scatter(std::type_identity_t<Buffer<const T>> in, Buffer<T> out, reduce_op op,
                      std::error_code& ec) noexcept {
    run(ec, [&] { self().template reduce_scatter<T>(in, out, op); });
  }
  template <element T>
  void reduce_scatter(Buffer<T> buf, reduce_op op, std::error_code& ec) noexcept {
    run(ec, [&] { self().template reduce_scatter<T>(buf, op); });
  }
  template <element T>
  void allgather(std::type_identity_t<Buffer<const T>> in, Buffer<T> out, std::error_code& ec) noexcept {
    run(ec, [&] { self().template allgather<T>(in, out); });
  }
  template <element T>
  void allgather(Buffer<T> buf, std::error_code& ec) noexcept {
    run(ec, [&] { self().template allgather<T>(buf); });
  }
  template <element T>
  void gather(std::type_identity_t<Buffer<const T>> in, Buffer<T> out, int root, std::error_code& ec) noexcept {
    run(ec, [&] { self().template gather<T>(in, out, root); });
  }
  template <element T>
  void scatter(std::type_identity_t<Buffer<const T>> in, Buffer<T> out, int root, std::error_code& ec) noexcept {
    run(ec, [&] { self().template scatter<T>(in, out, root); });
  }
  template <element T>
  void alltoall(std::type_identity_t<Buffer<const T>> in, Buffer<T> out, std::error_code& ec) noexcept {
    run(ec, [&] { self().template alltoall<T>(in, out); });
  }
  template <element T>
  void alltoall(Buffer<T> buf, std::error_code& ec) noexcept {
    run(ec, [&] { self().template alltoall<T>(buf); });
  }
  void barrier(std::error_code& ec) noexcept {
    run(ec, [&] { self().barrier(); });
  }

 protected:
  std::string* error_message() noexcept { return nullptr; }

 private:
  Derived& self() noexcept { return static_cast<Derived&>(*this); }
  template <class F>
  void run(std::error_code& ec, F&& f) noexcept {
    catch_into(ec, self().error_message(), f);
  }
};

}  // namespace dtrain::detail
