// A Backend that forwards every call to another one (the CPU backend by default): tests derive
// from it and override what they need to observe or change (fences, copies, scratch sizes).
#pragma once
#include <memory>
#include <span>
#include <string>

#include "kernels/backend.h"

namespace flexh2o::testing {

class ForwardingBackend : public kernels::Backend {
 public:
  explicit ForwardingBackend(std::unique_ptr<kernels::Backend> inner = kernels::make_cpu_backend())
      : inner_(std::move(inner)) {}

  kernels::DeviceKind kind() const override { return inner_->kind(); }
  std::string name() const override { return inner_->name(); }
  void* alloc(std::size_t bytes) override { return inner_->alloc(bytes); }
  void free(void* p) noexcept override { inner_->free(p); }
  void copy_to_device(void* dst, const void* src, std::size_t bytes) override { inner_->copy_to_device(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, std::size_t bytes) override { inner_->copy_to_host(dst, src, bytes); }
  void copy_on_device(void* dst, const void* src, std::size_t bytes) override { inner_->copy_on_device(dst, src, bytes); }
  void synchronize() override { inner_->synchronize(); }
  std::shared_ptr<const kernels::Fence> fence() override { return inner_->fence(); }
  void copy_regions(kernels::CopyDirection dir, std::span<const kernels::CopyRegion> regions,
                    const kernels::Fence* after) override {
    inner_->copy_regions(dir, regions, after);
  }
  std::int64_t memory_capacity() const override { return inner_->memory_capacity(); }
  bool pin_host(void* p, std::size_t bytes) override { return inner_->pin_host(p, bytes); }
  void unpin_host(void* p) noexcept override { inner_->unpin_host(p); }

  bool native_bf16() const override { return inner_->native_bf16(); }
  kernels::DType gemm_weight_dtype(kernels::DType stored, kernels::DType compute) const override {
    return inner_->gemm_weight_dtype(stored, compute);
  }
  bool takes_bf16_gemm_inputs() const override { return inner_->takes_bf16_gemm_inputs(); }
  bool reads_shared_prefixes_once() const override { return inner_->reads_shared_prefixes_once(); }
  kernels::KernelUse kernel_use() const override { return inner_->kernel_use(); }
  const float* logits_on_host(const float* logits, std::int64_t rows, std::int64_t vocab) override {
    return inner_->logits_on_host(logits, rows, vocab);
  }
  std::int64_t gemm_scratch_bytes(std::int64_t m, std::int64_t k, std::int64_t n, kernels::DType w,
                                  kernels::DType compute) const override {
    return inner_->gemm_scratch_bytes(m, k, n, w, compute);
  }
  std::int64_t attention_scratch_bytes(const kernels::AttentionShape& s, std::int64_t rows, std::int64_t batch,
                                       std::int64_t capacity, bool scores) const override {
    return inner_->attention_scratch_bytes(s, rows, batch, capacity, scores);
  }

 protected:
  kernels::Backend& inner() { return *inner_; }
  // The ops go to the inner backend (which checks them again).
  void do_gemm(const kernels::GemmArgs& a) override { inner_->gemm(a); }
  void do_layer_norm(const kernels::NormArgs& a) override { inner_->layer_norm(a); }
  void do_rms_norm(const kernels::NormArgs& a) override { inner_->rms_norm(a); }
  void do_rope(const kernels::RopeArgs& a) override { inner_->rope(a); }
  void do_activation(kernels::Activation act, float* x, std::int64_t n) override { inner_->activation(act, x, n); }
  void do_glu(kernels::Activation act, const float* gate, const float* up, float* out, std::int64_t n) override {
    inner_->glu(act, gate, up, out, n);
  }
  void do_bias_act(const kernels::BiasActArgs& a) override { inner_->bias_act(a); }
  void do_softcap(float* x, std::int64_t n, float cap) override { inner_->softcap(x, n, cap); }
  void do_add(float* x, const float* y, std::int64_t n) override { inner_->add(x, y, n); }
  void do_round_to_dtype(kernels::DType t, float* x, std::int64_t n) override { inner_->round_to_dtype(t, x, n); }
  void do_embedding(const kernels::EmbeddingArgs& a) override { inner_->embedding(a); }
  void do_attention_prefill(const kernels::AttentionPrefillArgs& a) override { inner_->attention_prefill(a); }
  void do_attention_decode(const kernels::AttentionDecodeArgs& a) override { inner_->attention_decode(a); }
  void do_kv_write(const kernels::KvWriteArgs& a) override { inner_->kv_write(a); }
  void do_kv_move(const kernels::KvMoveArgs& a) override { inner_->kv_move(a); }
  void do_kv_similarity(const kernels::KvSimilarityArgs& a) override { inner_->kv_similarity(a); }
  void do_kv_merge(const kernels::KvMergeArgs& a) override { inner_->kv_merge(a); }
  void do_sample(const kernels::SampleArgs& a) override { inner_->sample(a); }
  void do_route(const kernels::RouteArgs& a) override { inner_->route(a); }
  void do_moe_experts(const kernels::MoeArgs& a) override { inner_->moe_experts(a); }

 private:
  std::unique_ptr<kernels::Backend> inner_;
};

}  // namespace flexh2o::testing
