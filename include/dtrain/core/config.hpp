#pragma once
/// @file
/// Compiler portability macros shared by host and device code.

#if defined(__CUDACC__) || defined(__HIPCC__)
/// Marks a function callable from host and device code when built by nvcc; empty otherwise.
#define DTRAIN_HOST_DEVICE __host__ __device__
#else
#define DTRAIN_HOST_DEVICE
#endif

#if defined(__GNUC__) || defined(__clang__)
/// Promises the compiler that two pointers do not alias, so that loops over them vectorise.
#define DTRAIN_RESTRICT __restrict__
#else
#define DTRAIN_RESTRICT
#endif
