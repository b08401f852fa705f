#include "kernels/cpu/cpu_backend.h"

#include <cblas.h>

#include <cstdlib>
#include <cstring>
#include <new>

namespace flexh2o::kernels {

namespace {
constexpr std::size_t kAlignment = 64;  // cache line; also what AVX-512 loads like
}

CpuBackend::CpuBackend() {
  // Parallelism comes from oneTBB tasks that each call a single-threaded BLAS; letting
  // OpenBLAS start its own threads as well would oversubscribe the cores.
  openblas_set_num_threads(1);
}

void* CpuBackend::alloc(std::size_t bytes) {
  const std::size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded == 0 ? kAlignment : rounded);
  if (!p) throw std::bad_alloc();
  return p;
}

void CpuBackend::free(void* p) noexcept { std::free(p); }

void CpuBackend::copy_to_device(void* dst, const void* src, std::size_t bytes) { std::memcpy(dst, src, bytes); }
void CpuBackend::copy_to_host(void* dst, const void* src, std::size_t bytes) { std::memcpy(dst, src, bytes); }
void CpuBackend::copy_on_device(void* dst, const void* src, std::size_t bytes) { std::memmove(dst, src, bytes); }

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace flexh2o::kernels
