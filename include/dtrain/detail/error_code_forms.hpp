#pragma once
// The noexcept `std::error_code` forms of a collective's operations, each defined from its
// throwing form (for models whose failures are exceptions from below: NCCL, staging).

#include <system_error>
#include <type_traits>

#include "dtrain/core/error.hpp"

/// Defines `template <element T> void name params noexcept`, which calls `name<T> args` and
/// reports what it throws through the `ec` named in `params`.
#define DTRAIN_ERROR_CODE_FORM(name, params, args) \
  template <element T>                              \
  void name params noexcept {                       \
    ec.clear();                                     \
    try {                                           \
      name<T> args;                                 \
    } catch (const std::system_error& e) {          \
      ec = e.code();                                \
    } catch (...) {                                 \
      ec = make_error_code(errc::broken);           \
    }                                               \
  }

/// The error-code forms of the nine operations, for buffers `Buf<T>` (`device_span`,
/// `thrust_buffer`), and of `barrier`.
#define DTRAIN_ERROR_CODE_FORMS(Buf)                                                                                    \
  DTRAIN_ERROR_CODE_FORM(broadcast, (Buf<T> buf, int root, std::error_code& ec), (buf, root))                           \
  DTRAIN_ERROR_CODE_FORM(reduce, (std::type_identity_t<Buf<const T>> in, Buf<T> out, reduce_op op, int root,            \
                                  std::error_code& ec), (in, out, op, root))                                            \
  DTRAIN_ERROR_CODE_FORM(allreduce, (std::type_identity_t<Buf<const T>> in, Buf<T> out, reduce_op op,                   \
                                     std::error_code& ec), (in, out, op))                                               \
  DTRAIN_ERROR_CODE_FORM(allreduce, (Buf<T> buf, reduce_op op, std::error_code& ec), (buf, op))                         \
  DTRAIN_ERROR_CODE_FORM(reduce_scatter, (std::type_identity_t<Buf<const T>> in, Buf<T> out, reduce_op op,              \
                                          std::error_code& ec), (in, out, op))                                          \
  DTRAIN_ERROR_CODE_FORM(allgather, (std::type_identity_t<Buf<const T>> in, Buf<T> out, std::error_code& ec), (in, out)) \
  DTRAIN_ERROR_CODE_FORM(gather, (std::type_identity_t<Buf<const T>> in, Buf<T> out, int root, std::error_code& ec),    \
                         (in, out, root))                                                                               \
  DTRAIN_ERROR_CODE_FORM(scatter, (std::type_identity_t<Buf<const T>> in, Buf<T> out, int root, std::error_code& ec),   \
                         (in, out, root))                                                                               \
  DTRAIN_ERROR_CODE_FORM(alltoall, (std::type_identity_t<Buf<const T>> in, Buf<T> out, std::error_code& ec), (in, out)) \
  void barrier(std::error_code& ec) noexcept {                                                                          \
    ec.clear();                                                                                                         \
    try {                                                                                                               \
      barrier();                                                                                                        \
    } catch (const std::system_error& e) {                                                                              \
      ec = e.code();                                                                                                    \
    } catch (...) {                                                                                                     \
      ec = make_error_code(errc::broken);                                                                               \
    }                                                                                                                   \
  }
