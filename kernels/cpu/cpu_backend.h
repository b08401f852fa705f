// CPU implementation of Backend: oneTBB for parallel loops; GEMM through oneDNN matmul
// primitives (gemm_cpu.cc), or an own AVX2 kernel for a few activation rows (gemv_cpu.h);
// OpenBLAS only for prefill attention's small products (attention_cpu.cc).
// Each op family lives in its own *_cpu.cc next to this header.
#pragma once
#include <array>
#include <atomic>
#include <cstdint>

#include "kernels/backend.h"

namespace flexh2o::kernels {

class CpuBackend final : public Backend {
 public:
  CpuBackend();
  DeviceKind kind() const override { return DeviceKind::Cpu; }
  std::string name() const override { return "cpu"; }

  void* alloc(std::size_t bytes) override;
  void free(void* p) noexcept override;
  void copy_to_device(void* dst, const void* src, std::size_t bytes) override;
  void copy_to_host(void* dst, const void* src, std::size_t bytes) override;
  void copy_on_device(void* dst, const void* src, std::size_t bytes) override;
  void synchronize() override {}
  bool native_bf16() const override;
  std::optional<std::int64_t> bf16_faster_from_rows(DType weights) const override;
  bool reads_shared_prefixes_once() const override { return true; }
  // oneDNN's ISA, the GEMM paths taken (gemm_cpu.h) and oneDNN's matmul implementations.
  KernelUse kernel_use() const override;

 protected:
  void do_gemm(const GemmArgs& a) override;
  void do_layer_norm(const NormArgs& a) override;
  void do_rms_norm(const NormArgs& a) override;
  void do_rope(const RopeArgs& a) override;
  void do_activation(Activation act, float* x, std::int64_t n) override;
  void do_glu(Activation act, const float* gate, const float* up, float* out, std::int64_t n) override;
  void do_bias_act(const BiasActArgs& a) override;
  void do_softcap(float* x, std::int64_t n, float cap) override;
  void do_add(float* x, const float* y, std::int64_t n) override;
  void do_round_to_dtype(DType t, float* x, std::int64_t n) override;
  void do_embedding(const EmbeddingArgs& a) override;
  void do_attention_prefill(const AttentionPrefillArgs& a) override;
  void do_attention_decode(const AttentionDecodeArgs& a) override;
  void do_kv_write(const KvWriteArgs& a) override;
  void do_kv_move(const KvMoveArgs& a) override;
  void do_kv_similarity(const KvSimilarityArgs& a) override;
  void do_kv_merge(const KvMergeArgs& a) override;
  void do_sample(const SampleArgs& a) override;
  void do_route(const RouteArgs& a) override;
  void do_moe_experts(const MoeArgs& a) override;

 private:
  void run_gemm(const GemmArgs& a);
  // Per CpuGemmPath: calls and FLOPs.
  std::array<std::atomic<std::int64_t>, 5> gemm_calls_{}, gemm_flops_{};
};

}  // namespace flexh2o::kernels
