// The one platform header for the optional vendor libraries: it includes cuda_runtime.h,
// cublasLt.h, nccl.h and mpi.h (each only when the build has it) and defines the CHECK macros that
// turn their status codes into zaya::Error with the call, file:line and the library's own error
// string. Include it only from files that are built with those libraries (*_cuda.cpp, *.cu,
// *_mpi.cpp, *_nccl.cpp); CPU-only code must not depend on it.
// This header does not include fmt (nor error.h, which does): nvcc with a C++20 host compiler
// rejects fmt 9's headers, and .cu files include this one. platform_fail, defined in
// cuda_check.cpp, throws the zaya::Error.
#pragma once
#include <string>

#if defined(ZAYA_HAVE_CUDA) || defined(__CUDACC__)
#include <cublasLt.h>
#include <cuda_runtime.h>
#endif
#if defined(ZAYA_HAVE_NCCL)
#include <nccl.h>
#endif
#if defined(ZAYA_HAVE_MPI)
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // the C API only: no deprecated C++ bindings
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>
#endif

namespace zaya::detail {
// Throws zaya::Error("<lib> error: <call> failed at <file>:<line>: <what>").
[[noreturn]] void platform_fail(const char* lib, const char* call, const char* file, int line,
                                const std::string& what);
}  // namespace zaya::detail

#if defined(ZAYA_HAVE_CUDA) || defined(__CUDACC__)
#define ZAYA_CUDA_CHECK(call)                                                               \
  do {                                                                                      \
    cudaError_t zaya_err_ = (call);                                                         \
    if (zaya_err_ != cudaSuccess)                                                           \
      ::zaya::detail::platform_fail(                                                        \
          "CUDA", #call, __FILE__, __LINE__,                                                \
          std::string(cudaGetErrorName(zaya_err_)) + ": " + cudaGetErrorString(zaya_err_)); \
  } while (0)

#define ZAYA_CUBLAS_CHECK(call)                                                 \
  do {                                                                          \
    cublasStatus_t zaya_st_ = (call);                                           \
    if (zaya_st_ != CUBLAS_STATUS_SUCCESS)                                      \
      ::zaya::detail::platform_fail("cuBLAS", #call, __FILE__, __LINE__,        \
                                    "status " + std::to_string(int(zaya_st_))); \
  } while (0)
#endif

#if defined(ZAYA_HAVE_NCCL)
#define ZAYA_NCCL_CHECK(call)                                                                  \
  do {                                                                                         \
    ncclResult_t zaya_nr_ = (call);                                                            \
    if (zaya_nr_ != ncclSuccess && zaya_nr_ != ncclInProgress)                                 \
      ::zaya::detail::platform_fail(                                                           \
          "NCCL", #call, __FILE__, __LINE__,                                                   \
          std::string(ncclGetErrorString(zaya_nr_)) + " (" + ncclGetLastError(nullptr) + ")"); \
  } while (0)
#endif

#if defined(ZAYA_HAVE_MPI)
#define ZAYA_MPI_CHECK(call)                                                    \
  do {                                                                          \
    int zaya_mr_ = (call);                                                      \
    if (zaya_mr_ != MPI_SUCCESS) {                                              \
      char zaya_msg_[MPI_MAX_ERROR_STRING];                                     \
      int zaya_len_ = 0;                                                        \
      MPI_Error_string(zaya_mr_, zaya_msg_, &zaya_len_);                        \
      ::zaya::detail::platform_fail("MPI", #call, __FILE__, __LINE__,           \
                                    std::string(zaya_msg_, size_t(zaya_len_))); \
    }                                                                           \
  } while (0)
#endif
