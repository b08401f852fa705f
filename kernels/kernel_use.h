// What a backend's kernels ran, for the run report (`kernels:` line, --metrics "kernels"): the
// instruction set it dispatches for, its GEMMs by path (calls and FLOPs), and the library
// primitives they used (oneDNN's implementation names: a "ref" one is a slow fallback).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace flexh2o::kernels {

struct KernelUse {
  std::string isa;  // e.g. "avx512_core_bf16" (oneDNN's effective ISA), a GPU's name
  struct Path {
    std::string name;
    std::int64_t calls = 0;
    std::int64_t flops = 0;  // 2 m n k summed
  };
  std::vector<Path> gemm;               // the paths taken, most FLOPs first
  std::vector<std::string> primitives;  // library implementations used, sorted
};

}  // namespace flexh2o::kernels
