// Which decode queries the CUDA backend runs on tensor cores (attention_prefill_mma.cu) and
// which on the decode kernel (attention_gpu.cu): host-side, without CUDA, so that it is tested
// on every machine. Under bf16 compute a run of a prompt's rows (kernels/decode_runs.h) becomes
// causal FlashAttention-2 tiles that read the row's keys once per tile of queries, where the
// decode kernel would read them once per query.
#pragma once
#include <cstdint>

#include "kernels/attention.h"
#include "kernels/decode_runs.h"

namespace flexh2o::kernels::cuda {

// Shorter runs stay on the decode kernel: a run of n queries fills n of a tile's 64 rows, and
// below 8 the tile's wasted tensor-core work (64 / n times the useful) approaches what the
// decode kernel, which reads a cache row once for the whole GQA group, spends on CUDA cores.
constexpr std::int64_t kMinTensorCoreRun = 8;

// The head dims the tensor-core attention kernel has: 64, 80, 96, 128, 256.
bool mma_head_dim(std::int64_t head_dim);

// Whether attention_decode may run a's runs on tensor cores; where not, every query stays on the
// decode kernel. The fallback cases: f32 compute; a cache that is not f16 or bf16 (f32, q8, q4
// keep the decode kernel); a head dim the kernel lacks; no cache_rows (no runs); probs or
// slot_bias asked for (per cache row, not with cache_rows anyway); q, the caches or out not
// aligned for the kernel's 16-byte loads and 8-byte stores.
bool decode_runs_on_tensor_cores(const AttentionDecodeArgs& a);

}  // namespace flexh2o::kernels::cuda
