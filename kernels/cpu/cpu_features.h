// Which instruction sets the CPU's own kernels may use, asked once of CPUID. The kernels are
// compiled with target attributes, so one binary runs on any x86-64 and takes its generic path
// (oneDNN, which dispatches by itself) where these are missing.
#pragma once
#include <cpuid.h>

namespace flexh2o::kernels {

// The paths of a kernel with vector variants: the plain loops (every x86-64), AVX2+FMA+F16C,
// AVX-512. Kernels that take one let the tests run every path the CPU has.
enum class Isa { Scalar, Avx2, Avx512 };

// AVX2 + FMA + F16C, with the OS saving the ymm registers.
inline bool cpu_has_avx2_fma_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  if (!(c & bit_FMA) || !(c & bit_AVX) || !(c & bit_OSXSAVE) || !(c & bit_F16C)) return false;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return b & bit_AVX2;
}

// AVX-512 F, with the OS saving the opmask and zmm registers.
inline bool cpu_has_avx512f() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return false;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(b & bit_AVX512F)) return false;
  unsigned lo = 0, hi = 0;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & 0xe6) == 0xe6;  // SSE, AVX, opmask, ZMM_Hi256 and Hi16_ZMM state
}

// AVX-512 F, BW, VL and BF16 (vdpbf16ps, vcvtne2ps2bf16), with F16C.
inline bool cpu_has_avx512_bf16() {
  if (!cpu_has_avx512f() || !cpu_has_avx2_fma_f16c()) return false;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(b & bit_AVX512BW) || !(b & bit_AVX512VL)) return false;
  if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
  return a & bit_AVX512BF16;  // in CPUID.(7, 1):EAX
}

}  // namespace flexh2o::kernels
