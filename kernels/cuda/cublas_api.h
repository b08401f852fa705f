// cuBLAS, loaded at run time (dlopen) instead of linked: a CUDA build then starts on a host
// without libcublas, and make_backend("auto") falls back to the CPU saying why, as it does
// without a driver. The backend calls cuBLAS only through these pointers.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>

#include <optional>
#include <string>

namespace flexh2o::kernels::cuda {

struct CublasApi {
  decltype(&::cublasCreate_v2) create = nullptr;
  decltype(&::cublasDestroy_v2) destroy = nullptr;
  decltype(&::cublasSetStream_v2) set_stream = nullptr;
  decltype(&::cublasSetMathMode) set_math_mode = nullptr;
  decltype(&::cublasSetWorkspace_v2) set_workspace = nullptr;
  decltype(&::cublasSgemm_v2) sgemm = nullptr;
  // cublasGemmEx is overloaded in C++ (a wrapper takes the legacy cudaDataType compute type).
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  decltype(&::cublasGetStatusName) status_name = nullptr;
  decltype(&::cublasGetStatusString) status_string = nullptr;
  // cuBLASLt (libcublasLt, which libcublas needs, so found through it): GEMMs with the bias in
  // the epilogue (gemm_lt.h).
  decltype(&::cublasLtCreate) lt_create = nullptr;
  decltype(&::cublasLtDestroy) lt_destroy = nullptr;
  decltype(&::cublasLtMatmulDescCreate) lt_desc_create = nullptr;
  decltype(&::cublasLtMatmulDescDestroy) lt_desc_destroy = nullptr;
  decltype(&::cublasLtMatmulDescSetAttribute) lt_desc_set = nullptr;
  decltype(&::cublasLtMatrixLayoutCreate) lt_layout_create = nullptr;
  decltype(&::cublasLtMatrixLayoutDestroy) lt_layout_destroy = nullptr;
  decltype(&::cublasLtMatmulPreferenceCreate) lt_pref_create = nullptr;
  decltype(&::cublasLtMatmulPreferenceDestroy) lt_pref_destroy = nullptr;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) lt_pref_set = nullptr;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) lt_heuristic = nullptr;
  decltype(&::cublasLtMatmul) lt_matmul = nullptr;
};

// libcublas.so.<major version of the cuBLAS headers this build used>.
std::string cublas_library_name();

// Loads `library` (a name the dynamic loader searches for, or a path) and looks up every
// function (cuBLASLt's in the libcublasLt it depends on); empty, with the reason in *why,
// when the library or a function is missing.
std::optional<CublasApi> load_cublas(const std::string& library, std::string* why);

// The process's cuBLAS: cublas_library_name() from the loader's search path, else from the
// CUDA toolkit this was built with; loaded once. Throws std::runtime_error saying why not.
const CublasApi& cublas();
// Empty when cublas() loads; otherwise why not.
std::string cublas_unavailable_reason();

}  // namespace flexh2o::kernels::cuda
