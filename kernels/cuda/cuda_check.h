// Error checks for CUDA runtime and cuBLAS calls: every call goes through one of these
// macros, and every kernel launch is followed by FLEXH2O_CUDA_CHECK_LAUNCH(). A failure
// throws std::runtime_error naming the call, file:line and the library's own message.
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/cublas_api.h"

namespace flexh2o::kernels::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t e, const char* call, const char* file, int line) {
  // Clear the thread's last error so that a caller who catches this and goes on does not
  // see it again at the next launch check (sticky errors stay, as they must).
  (void)cudaGetLastError();
  throw std::runtime_error(std::string("CUDA error: ") + call + " failed at " + file + ":" + std::to_string(line) +
                           ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

[[noreturn]] inline void throw_cublas_error(cublasStatus_t s, const char* call, const char* file, int line) {
  // Only reached after a cuBLAS call, so the library is loaded.
  const CublasApi& api = cublas();
  throw std::runtime_error(std::string("cuBLAS error: ") + call + " failed at " + file + ":" + std::to_string(line) +
                           ": " + api.status_name(s) + " (" + api.status_string(s) + ")");
}

}  // namespace flexh2o::kernels::cuda

#define FLEXH2O_CUDA_CHECK(call)                                                        \
  do {                                                                                  \
    const cudaError_t flexh2o_err_ = (call);                                            \
    if (flexh2o_err_ != cudaSuccess)                                                    \
      ::flexh2o::kernels::cuda::throw_cuda_error(flexh2o_err_, #call, __FILE__, __LINE__); \
  } while (0)

#define FLEXH2O_CUBLAS_CHECK(call)                                                          \
  do {                                                                                      \
    const cublasStatus_t flexh2o_st_ = (call);                                              \
    if (flexh2o_st_ != CUBLAS_STATUS_SUCCESS)                                               \
      ::flexh2o::kernels::cuda::throw_cublas_error(flexh2o_st_, #call, __FILE__, __LINE__); \
  } while (0)

// After every <<<...>>> launch: reports a bad launch configuration at once (errors inside
// the kernel surface at the next synchronising call, which is checked too).
#define FLEXH2O_CUDA_CHECK_LAUNCH() FLEXH2O_CUDA_CHECK(cudaGetLastError())
