#pragma once
/// @file
/// dtrain's elements and reduction operators in NCCL's terms, for `nccl_communicator`
/// (nccl.hpp). Link `dtrain::nccl`.

#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "dtrain/core/element.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/reduce_op.hpp"
#include "dtrain/core/signature.hpp"

namespace dtrain {

namespace detail::nccl {

template <class T>
constexpr ncclDataType_t type_of() {
  if constexpr (std::is_same_v<T, float>) return ncclFloat32;
  else if constexpr (std::is_same_v<T, double>) return ncclFloat64;
  else if constexpr (std::is_same_v<T, std::int32_t>) return ncclInt32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return ncclInt64;
  else if constexpr (std::is_same_v<T, float16>) return ncclFloat16;
  else if constexpr (std::is_same_v<T, bfloat16>) return ncclBfloat16;
  else if constexpr (std::is_same_v<T, std::int8_t>) return ncclInt8;
  // bool and raw bytes travel as uint8; bool's reductions are mapped onto max and min (op_of).
  else if constexpr (std::is_same_v<T, std::uint8_t> || std::is_same_v<T, bool> || std::is_same_v<T, std::byte>)
    return ncclUint8;
  else static_assert(sizeof(T) == 0, "no NCCL type for this element");
}

/// NCCL's operator for `op` on `T`. On bool, "or" (sum, bor) is max and "and" (prod, band) is
/// min (a byte of 2 is not a bool). @throws dtrain::error (invalid_argument) for `custom` (NCCL
/// runs only its own operators) and for avg of bool; (unsupported) for the bitwise operators
/// NCCL lacks.
template <class T>
ncclRedOp_t op_of(reduce_op op) {
  static_assert(reducible_v<T>, "raw bytes move but do not reduce");
  if (const char* why = refused_reduction<T>(op)) throw error(errc::invalid_argument, std::string("dtrain: ") + why);
  if constexpr (std::is_same_v<T, bool>) {
    if (op == reduce_op::sum || op == reduce_op::bor) return ncclMax;
    if (op == reduce_op::prod || op == reduce_op::band) return ncclMin;
  }
  switch (op) {
    case reduce_op::sum: return ncclSum;
    case reduce_op::prod: return ncclProd;
    case reduce_op::min: return ncclMin;
    case reduce_op::max: return ncclMax;
    case reduce_op::avg: return ncclAvg;
    case reduce_op::band:
    case reduce_op::bor:
    case reduce_op::bxor:
      throw error(errc::unsupported, std::string("dtrain: NCCL has no bitwise reduction (") +
                                         std::string(reduce_op_name(op)) +
                                         "); reduce on the host, or use min and max on bools for and and or");
    case reduce_op::custom: break;
  }
  return ncclSum;  // not reached: refused above
}

inline std::string text(ncclResult_t r) { return ncclGetErrorString(r); }

// What the flight recorder keeps of a call of `op` on `count` elements of `T`.
template <class T>
signature call(coll_op op, std::size_t count, reduce_op r = reduce_op::sum, int root = 0) {
  signature s;
  s.op = op, s.type = dtype_of<T>::value, s.redop = r, s.root = root, s.count = count;
  return s;
}

// Arguments checked before anything is enqueued. @throws dtrain::error (invalid_argument)
inline void check_root(int root, int size, const char* what) {
  if (root < 0 || root >= size) {
    throw error(errc::invalid_argument, std::string("nccl ") + what + ": root " + std::to_string(root) +
                                            " outside a group of " + std::to_string(size));
  }
}
inline void same_size(std::size_t a, std::size_t b, const char* what) {
  if (a != b) {
    throw error(errc::invalid_argument, std::string("nccl ") + what + ": buffers of " + std::to_string(a) + " and " +
                                            std::to_string(b) + " elements");
  }
}
// The size of each of `size` blocks of `n` elements.
inline std::size_t block(std::size_t n, int size, const char* what) {
  if (n % static_cast<std::size_t>(size) != 0) {
    throw error(errc::invalid_argument, std::string("nccl ") + what + ": " + std::to_string(n) +
                                            " elements do not split into " + std::to_string(size) + " blocks");
  }
  return n / static_cast<std::size_t>(size);
}

}  // namespace detail::nccl

}  // namespace dtrain
