#include "kernels/cuda/cublas_api.h"

#include <dlfcn.h>

#include <stdexcept>
#include <type_traits>

namespace flexh2o::kernels::cuda {

namespace {

struct Loaded {
  std::optional<CublasApi> api;
  std::string why;
};

const Loaded& process_cublas() {
  static const Loaded loaded = [] {
    Loaded l;
    const std::string name = cublas_library_name();
    l.api = load_cublas(name, &l.why);
#ifdef FLEXH2O_CUDA_TOOLKIT_LIBRARY_DIR
    if (!l.api) {
      std::string why_toolkit;
      l.api = load_cublas(std::string(FLEXH2O_CUDA_TOOLKIT_LIBRARY_DIR) + "/" + name, &why_toolkit);
    }
#endif
    if (l.api) l.why.clear();
    return l;
  }();
  return loaded;
}

}  // namespace

std::string cublas_library_name() { return "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR); }

std::optional<CublasApi> load_cublas(const std::string& library, std::string* why) {
  // Never closed: the handle lives as long as the process, as a linked library would.
  void* lib = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = ::dlerror();
    *why = "cuBLAS (" + library + ") cannot be loaded: " + (err ? err : "unknown error") +
           "; install the CUDA toolkit's cuBLAS or add its directory to LD_LIBRARY_PATH";
    return std::nullopt;
  }
  CublasApi api;
  bool complete = true;
  auto get = [&](auto& fn, const char* symbol) {
    void* p = ::dlsym(lib, symbol);
    if (p == nullptr && complete) {
      complete = false;
      *why = "cuBLAS (" + library + ") has no " + symbol + "; it is older than the CUDA " +
             std::to_string(CUBLAS_VER_MAJOR) + " toolkit this was built with";
    }
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
  };
  get(api.create, "cublasCreate_v2");
  get(api.destroy, "cublasDestroy_v2");
  get(api.set_stream, "cublasSetStream_v2");
  get(api.set_math_mode, "cublasSetMathMode");
  get(api.set_workspace, "cublasSetWorkspace_v2");
  get(api.sgemm, "cublasSgemm_v2");
  get(api.gemm_ex, "cublasGemmEx");
  get(api.status_name, "cublasGetStatusName");
  get(api.status_string, "cublasGetStatusString");
  get(api.lt_create, "cublasLtCreate");
  get(api.lt_destroy, "cublasLtDestroy");
  get(api.lt_desc_create, "cublasLtMatmulDescCreate");
  get(api.lt_desc_destroy, "cublasLtMatmulDescDestroy");
  get(api.lt_desc_set, "cublasLtMatmulDescSetAttribute");
  get(api.lt_layout_create, "cublasLtMatrixLayoutCreate");
  get(api.lt_layout_destroy, "cublasLtMatrixLayoutDestroy");
  get(api.lt_pref_create, "cublasLtMatmulPreferenceCreate");
  get(api.lt_pref_destroy, "cublasLtMatmulPreferenceDestroy");
  get(api.lt_pref_set, "cublasLtMatmulPreferenceSetAttribute");
  get(api.lt_heuristic, "cublasLtMatmulAlgoGetHeuristic");
  get(api.lt_matmul, "cublasLtMatmul");
  if (!complete) return std::nullopt;
  return api;
}

const CublasApi& cublas() {
  const Loaded& l = process_cublas();
  if (!l.api) throw std::runtime_error(l.why);
  return *l.api;
}

std::string cublas_unavailable_reason() { return process_cublas().why; }

}  // namespace flexh2o::kernels::cuda
