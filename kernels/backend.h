// The compute device interface. The engine calls only this; kernels/cpu and kernels/cuda
// implement it. The CPU backend is also the reference the GPU backend is tested against.
// Pointers in op arguments are device memory of this backend; small index arrays
// (positions, offsets, ids) are host spans.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/gemm.h"
#include "kernels/kernel_use.h"
#include "kernels/moe.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "kernels/sampling.h"

namespace flexh2o::kernels {

enum class DeviceKind : std::uint8_t { Cpu, Cuda };

// A point in the order of the ops issued to a backend (Backend::fence): a copy ordered after it
// waits for the ops issued before it was taken, and for no later one.
class Fence {
 public:
  virtual ~Fence() = default;
};

// `rows` rows of `width` bytes, row i from src + i * src_pitch to dst + i * dst_pitch (one row:
// a plain copy, the pitches unused).
struct CopyRegion {
  void* dst = nullptr;
  const void* src = nullptr;
  std::size_t width = 0;
  std::size_t rows = 1;
  std::size_t dst_pitch = 0, src_pitch = 0;
};
enum class CopyDirection : std::uint8_t { ToDevice, ToHost };

class Backend {
 public:
  virtual ~Backend() = default;
  virtual DeviceKind kind() const = 0;
  virtual std::string name() const = 0;

  // Device memory. alloc throws std::bad_alloc-derived errors when out of memory.
  virtual void* alloc(std::size_t bytes) = 0;
  virtual void free(void* p) noexcept = 0;
  virtual void copy_to_device(void* dst, const void* host_src, std::size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* src, std::size_t bytes) = 0;
  virtual void copy_on_device(void* dst, const void* src, std::size_t bytes) = 0;
  // Waits for all work issued to this backend.
  virtual void synchronize() = 0;
  // A mark of the ops issued so far (from any thread), for copies that must see their results
  // but must not wait for ops issued later. Null where every op has finished when it returns
  // (CPU): there is nothing to wait for.
  virtual std::shared_ptr<const Fence> fence() { return nullptr; }
  // Host <-> device copies of strided regions, from any thread, all of one direction; returns
  // when they are done, with one wait for the whole batch. With a fence (from this backend's
  // fence()) they wait for the ops issued before it was taken and for no later one; without
  // (null), for every op issued before the call, as copy_to_device/copy_to_host do. The default
  // makes one copy_to_device/copy_to_host per region whose rows are contiguous on both sides,
  // else one per row, and ignores the fence (right for backends whose fence() is null).
  virtual void copy_regions(CopyDirection dir, std::span<const CopyRegion> regions, const Fence* after);
  // Bytes of device memory, or -1 where the device is host memory (CPU).
  virtual std::int64_t memory_capacity() const { return -1; }
  // Page-locks host memory so copies to and from the device can run asynchronously
  // (cudaHostRegister). Returns false where the backend gains nothing from it (CPU).
  virtual bool pin_host(void* /*p*/, std::size_t /*bytes*/) { return false; }
  virtual void unpin_host(void* /*p*/) noexcept {}
  // Whether GEMMs with bf16 compute run natively (bf16 matrix units) rather than emulated.
  virtual bool native_bf16() const = 0;
  // The fewest activation rows from which a GEMM of `weights` runs faster with bf16 compute than
  // with f32 here (where --compute-dtype auto takes bf16): 1 where bf16 always wins (a GPU's
  // matrix units), none where it never does.
  virtual std::optional<std::int64_t> bf16_faster_from_rows(DType /*weights*/) const { return 1; }
  // The dtype this backend's GEMMs multiply a weight stored as `stored` in under `compute`, when
  // the weight arrives in it already rounded (bit for bit what the GEMM would do to it), at the
  // same bytes per row: the engine converts such matrices once when it loads them
  // (engine/model/weights.h, held_dtype) rather than gemm converting them on every call.
  // `stored` where the GEMM reads the storage as it is (the CPU: its kernels read f16/bf16/q4/q8).
  virtual DType gemm_weight_dtype(DType stored, DType /*compute*/) const { return stored; }
  // Whether the ops that feed a bf16-compute GEMM should write its input already rounded to
  // bf16 (NormArgs::y_bf16, BiasActArgs::out_bf16, GemmArgs::x_bf16): where the GEMM would
  // otherwise round x in a pass of its own before it multiplies (CUDA). The results are the same
  // either way; the CPU rounds inside its GEMM kernels, so it gains nothing.
  virtual bool takes_bf16_gemm_inputs() const { return false; }
  // Whether attention_decode reads a shared prefix once for all its members where
  // shared_prefix_applies (AttentionDecodeArgs::shared_prefixes); false: each query reads its
  // own row whole (the KV bytes read then count every member's prefix).
  virtual bool reads_shared_prefixes_once() const { return false; }

  // A decode step's ops captured in a CUDA graph (docs/backends.md, "CUDA graphs"): the
  // executor brackets the device part of a step whose ops repeat from step to step (same
  // shapes, same buffers) with these, `key` naming the shape; the backend may then run the ops
  // issued in between later, as one graph, by graph_step_end at the latest. An op that needs the
  // host inside the bracket (a copy, a fence, a synchronize, sampling) runs everything issued so
  // far first, and the step eagerly. graph_step_cancel drops a step an exception left open.
  // No-ops by default (the CPU runs each op as it is called).
  virtual void graph_step_begin(std::uint64_t /*key*/) {}
  virtual void graph_step_end() {}
  virtual void graph_step_cancel() noexcept {}

  // What this backend's kernels have run so far (kernel_use.h); empty where it does not say.
  virtual KernelUse kernel_use() const { return {}; }

  // A batch's logits ([rows, vocab] fp32 at device memory `logits`) where the host reads them:
  // one device-to-host copy for the whole batch, into memory the backend keeps until its next
  // call, so that a step whose sequences sample one at a time (continuous batching) copies its
  // logits once. Sample them with SampleArgs::logits_on_host. The CPU returns `logits` itself.
  virtual const float* logits_on_host(const float* logits, std::int64_t /*rows*/, std::int64_t /*vocab*/) {
    return logits;
  }

  // The ops. Each checks its arguments here, once for every device (kernels/<op>.cc), then
  // runs the device's implementation (do_<op> in kernels/cpu/<op>_cpu.cc, kernels/cuda/<op>_gpu.cu).
  void gemm(const GemmArgs& a);
  void layer_norm(const NormArgs& a);
  void rms_norm(const NormArgs& a);
  void rope(const RopeArgs& a);
  void activation(Activation act, float* x, std::int64_t n);
  // out = act(gate) * up (SwiGLU, GeGLU); out may alias gate or up.
  void glu(Activation act, const float* gate, const float* up, float* out, std::int64_t n);
  // out = act(x + bias) * up (BiasActArgs): a projection's bias and activation, a gated MLP's
  // product, fp32 or bf16 out, in one pass.
  void bias_act(const BiasActArgs& a);
  // x = cap * tanh(x / cap) (Gemma-2's final-logit soft-cap).
  void softcap(float* x, std::int64_t n, float cap);
  // x += y
  void add(float* x, const float* y, std::int64_t n);
  // x[i] = the value a tensor of `t` (F16 or BF16, as kernels::round_to rounds) holds for x[i]:
  // fp32 K/V rows read as a 16-bit cache stores them.
  void round_to_dtype(DType t, float* x, std::int64_t n);
  void embedding(const EmbeddingArgs& a);
  void attention_prefill(const AttentionPrefillArgs& a);
  void attention_decode(const AttentionDecodeArgs& a);
  void kv_write(const KvWriteArgs& a);
  void kv_move(const KvMoveArgs& a);
  void kv_similarity(const KvSimilarityArgs& a);
  void kv_merge(const KvMergeArgs& a);
  void sample(const SampleArgs& a);
  // Mixture-of-experts routing (results on the host: they decide which experts to load) and
  // the routed experts' MLPs.
  void route(const RouteArgs& a);
  void moe_experts(const MoeArgs& a);

  // Device memory an op allocates for itself while it runs (and frees before the next op can
  // need it), at most, so that callers who budget device memory can count it; 0 where the op
  // needs none. gemm: for x[m, k] @ w[n, k]^T with w stored as `w`, in `compute` (GemmArgs).
  // Attention: the larger of a
  // prefill of `rows` rows and a decode of `batch` sequences over `capacity` slots, with the
  // score outputs (col_sums / probs) when `scores`.
  virtual std::int64_t gemm_scratch_bytes(std::int64_t /*m*/, std::int64_t /*k*/, std::int64_t /*n*/,
                                          DType /*w*/, DType /*compute*/) const {
    return 0;
  }
  virtual std::int64_t attention_scratch_bytes(const AttentionShape& /*shape*/, std::int64_t /*rows*/,
                                               std::int64_t /*batch*/, std::int64_t /*capacity*/,
                                               bool /*scores*/) const {
    return 0;
  }

 protected:
  // The devices' implementations, called with checked arguments.
  virtual void do_gemm(const GemmArgs& a) = 0;
  virtual void do_layer_norm(const NormArgs& a) = 0;
  virtual void do_rms_norm(const NormArgs& a) = 0;
  virtual void do_rope(const RopeArgs& a) = 0;
  virtual void do_activation(Activation act, float* x, std::int64_t n) = 0;
  virtual void do_glu(Activation act, const float* gate, const float* up, float* out, std::int64_t n) = 0;
  virtual void do_bias_act(const BiasActArgs& a) = 0;
  virtual void do_softcap(float* x, std::int64_t n, float cap) = 0;
  virtual void do_add(float* x, const float* y, std::int64_t n) = 0;
  virtual void do_round_to_dtype(DType t, float* x, std::int64_t n) = 0;
  virtual void do_embedding(const EmbeddingArgs& a) = 0;
  virtual void do_attention_prefill(const AttentionPrefillArgs& a) = 0;
  virtual void do_attention_decode(const AttentionDecodeArgs& a) = 0;
  virtual void do_kv_write(const KvWriteArgs& a) = 0;
  virtual void do_kv_move(const KvMoveArgs& a) = 0;
  virtual void do_kv_similarity(const KvSimilarityArgs& a) = 0;
  virtual void do_kv_merge(const KvMergeArgs& a) = 0;
  virtual void do_sample(const SampleArgs& a) = 0;
  virtual void do_route(const RouteArgs& a) = 0;
  virtual void do_moe_experts(const MoeArgs& a) = 0;
};

std::unique_ptr<Backend> make_cpu_backend();

// Whether this build contains the CUDA backend (FLEXH2O_CUDA).
bool cuda_compiled();
// Empty when the CUDA backend can run here; otherwise why not (not compiled in, no driver,
// no device, a GPU this build has no kernels for). Probed once per process.
std::string cuda_unavailable_reason();
// A backend by name: "cpu", "cuda" (throws std::invalid_argument saying why when CUDA is
// not compiled in or no device is usable), or "auto" (CUDA when usable, else CPU; a CUDA
// build without a usable device says so once on stderr). Other names throw
// std::invalid_argument.
std::unique_ptr<Backend> make_backend(const std::string& name);

// Device memory owned by a backend, freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Backend& b, std::size_t bytes) : backend_(&b), bytes_(bytes), ptr_(bytes ? b.alloc(bytes) : nullptr) {}
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      backend_ = o.backend_;
      bytes_ = o.bytes_;
      ptr_ = o.ptr_;
      o.ptr_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  ~DeviceBuffer() { reset(); }

  void reset() noexcept {
    if (ptr_) backend_->free(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* data() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  std::size_t bytes() const { return bytes_; }

 private:
  Backend* backend_ = nullptr;
  std::size_t bytes_ = 0;
  void* ptr_ = nullptr;
};

}  // namespace flexh2o::kernels
