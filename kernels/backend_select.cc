// make_backend: picks the CPU or CUDA backend by name. Built with or without CUDA; without
// it, no CUDA symbol is referenced.
#include <cstdio>
#include <mutex>
#include <stdexcept>
#include <string>

#include "kernels/backend.h"

#if defined(FLEXH2O_HAVE_CUDA) && FLEXH2O_HAVE_CUDA
#include "kernels/cuda/cuda_entry.h"
#define FLEXH2O_CUDA_COMPILED 1
#else
#define FLEXH2O_CUDA_COMPILED 0
#endif

namespace flexh2o::kernels {

bool cuda_compiled() { return FLEXH2O_CUDA_COMPILED != 0; }

std::string cuda_unavailable_reason() {
#if FLEXH2O_CUDA_COMPILED
  return cuda::probe_device();
#else
  return "this flexh2o was built without the CUDA backend (configure with -DFLEXH2O_CUDA=ON where the CUDA "
         "toolkit is installed)";
#endif
}

std::unique_ptr<Backend> make_backend(const std::string& name) {
  if (name == "cpu") return make_cpu_backend();
  if (name == "cuda") {
    if (!cuda_compiled())
      throw std::invalid_argument("backend 'cuda' is not available: " + cuda_unavailable_reason() +
                                  "; use the cpu backend");
    const std::string why = cuda_unavailable_reason();
    if (!why.empty())
      throw std::invalid_argument("backend 'cuda' is not available: no usable CUDA device (" + why +
                                  "); use the cpu backend");
#if FLEXH2O_CUDA_COMPILED
    return cuda::make_cuda_backend();
#endif
  }
  if (name == "auto") {
    if (!cuda_compiled()) return make_cpu_backend();
    std::string why = cuda_unavailable_reason();
    if (why.empty()) {
      try {
        return make_backend("cuda");
      } catch (const std::exception& e) {  // e.g. cuBLAS or the memory pool could not start
        why = e.what();
      }
    }
    static std::once_flag told;
    std::call_once(told, [&] {
      std::fprintf(stderr, "flexh2o: no usable CUDA device (%s); using the CPU backend\n", why.c_str());
    });
    return make_cpu_backend();
  }
  throw std::invalid_argument("unknown backend '" + name + "' (expected auto, cpu or cuda)");
}

}  // namespace flexh2o::kernels
