// CUDA implementation of Backend: cuBLAS (loaded at run time, cublas_api.h) for GEMM, cuBLASLt
// where it adds the bias in the epilogue (gemm_lt.h), own kernels for everything else. Each op
// family lives in its own *_gpu.cu next to this header; the CPU backend (kernels/cpu) is the
// reference whose semantics every op follows.
//
// Streams: all ops run in order on one compute stream, asynchronously to the host. Copies
// are synchronous calls made from several host threads (the offload copy lanes): each
// calling thread gets its own non-blocking stream. A copy with a fence (Backend::fence, an
// event recorded on the compute stream by the thread that queued the copy) first waits for
// that event only, so a prefetch queued before an op runs beside it; a copy without one waits
// for everything issued to the compute stream before the call. An op launched after a copy
// returned sees the copied data. Host threads block (not spin) in waits: the device is
// initialised with cudaDeviceScheduleBlockingSync.
//
// Memory: alloc/free and per-op scratch come from a stream-ordered memory pool on the
// compute stream that keeps freed memory (release threshold: unlimited), so the decode
// loop does not call cudaMalloc; an allocation that fails waits for pending frees and trims
// the pool's unused memory before it tries again. The scratch an op allocates is bounded and
// reported by gemm_scratch_bytes/attention_scratch_bytes, for the caller's budget. Small host
// index arrays (positions, ids, lens, slots) are uploaded into pool scratch with
// cudaMemcpyAsync on the compute stream.
#pragma once
#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cublas_api.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/decode_cascade.h"
#include "kernels/cuda/decode_plan.h"
#include "kernels/cuda/decode_runs.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/gemm_plan.h"
#include "kernels/cuda/graph_steps.h"

namespace flexh2o::kernels::cuda {

// Thrown by CudaBackend::alloc when the device is out of memory.
class CudaOutOfMemory : public std::bad_alloc {
 public:
  explicit CudaOutOfMemory(std::string what) : what_(std::move(what)) {}
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  std::string what_;
};

// Device bytes the attention ops (KV writes and moves, prefill, decode) allocate, at most: the
// larger of a prefill of `rows` rows (of at most `rows` sequences) and a decode of `batch`
// sequences over `capacity` slots; `scores`: with the eviction scores and per-head slots.
std::int64_t attention_scratch(const AttentionShape& s, std::int64_t rows, std::int64_t batch, std::int64_t capacity,
                               bool scores, int sm_count);

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device = 0);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  DeviceKind kind() const override { return DeviceKind::Cuda; }
  std::string name() const override { return name_; }
  std::int64_t memory_capacity() const override;

  void* alloc(std::size_t bytes) override;
  void free(void* p) noexcept override;
  void copy_to_device(void* dst, const void* host_src, std::size_t bytes) override;
  void copy_to_host(void* host_dst, const void* src, std::size_t bytes) override;
  void copy_on_device(void* dst, const void* src, std::size_t bytes) override;
  void synchronize() override;
  bool native_bf16() const override { return true; }  // tensor cores (sm_80+)
  // Under bf16 compute cuBLAS multiplies bf16 (gemm_plan.h): f16 weights are rounded to bf16
  // once at load instead of a panel at a time in every GEMM. f32 weights stay (half the bytes would
  // change what the budgets hold); q4/q8 are dequantized per GEMM.
  DType gemm_weight_dtype(DType stored, DType compute) const override {
    return stored == DType::F16 && compute == DType::BF16 ? DType::BF16 : stored;
  }
  // cuBLAS multiplies bf16 by bf16 only: an fp32 x costs a rounding pass per GEMM.
  bool takes_bf16_gemm_inputs() const override { return true; }
  // Cascade attention (decode_cascade.h): a prefix is read from its own row only, a chunk by
  // one block per 8 of its members' query heads (from memory once, the blocks beside it mostly
  // from L2), and no member's own row below the prefix's len.
  bool reads_shared_prefixes_once() const override { return true; }
  // The device, and the GEMMs run eagerly or captured (a replayed graph's are not counted) by
  // the dtype cuBLAS multiplied and whether the weight was converted in the call.
  KernelUse kernel_use() const override;
  // One copy into a pinned buffer kept for the next step (sampling_gpu.cu).
  const float* logits_on_host(const float* logits, std::int64_t rows, std::int64_t vocab) override;
  std::shared_ptr<const Fence> fence() override;
  void copy_regions(CopyDirection dir, std::span<const CopyRegion> regions, const Fence* after) override;
  bool pin_host(void* p, std::size_t bytes) override;
  void unpin_host(void* p) noexcept override;

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
  // Runs CpuBackend::sample on the logits, copied to the host first unless they are there
  // (logits_on_host): this keeps every backend's draws identical bit for bit.
  void do_sample(const SampleArgs& a) override;
  void do_route(const RouteArgs& a) override;
  void do_moe_experts(const MoeArgs& a) override;

 public:
  std::int64_t gemm_scratch_bytes(std::int64_t m, std::int64_t k, std::int64_t n, DType w,
                                  DType compute) const override {
    return plan_gemm(m, k, n, w, compute).scratch_bytes;
  }
  std::int64_t attention_scratch_bytes(const AttentionShape& s, std::int64_t rows, std::int64_t batch,
                                       std::int64_t capacity, bool scores) const override {
    return attention_scratch(s, rows, batch, capacity, scores, sm_count_);
  }

  // Group-wise quantization of `rows` rows of n fp32 values (device memory) into Q4/Q8
  // rows of row_bytes(t, n) bytes, and back; bit for bit what kernels/quantize.cc does.
  void quantize_rows(const float* x, void* out, DType t, std::int64_t rows, std::int64_t n);
  void dequantize_rows(const void* in, DType t, float* x, std::int64_t rows, std::int64_t n);

  cudaStream_t stream() const { return stream_; }

  // Decode steps in CUDA graphs (Backend::graph_step_begin; graph_steps.h, cuda_graphs.cu).
  void graph_step_begin(std::uint64_t key) override;
  void graph_step_end() override;
  void graph_step_cancel() noexcept override;
  // Graph steps so far, by how they ran (a missed replay ran eagerly and recorded; an
  // interrupted step met an op that needs the host and ran eagerly).
  struct GraphCounts {
    std::int64_t recorded = 0, captured = 0, replayed = 0, missed = 0, interrupted = 0;
  };
  GraphCounts graph_counts() const { return graph_.counts; }

 private:
  // One cuBLAS call of gemm: rows [m0, m0 + mr) of y, columns [n0, n0 + nr), from x and w
  // as the plan's inputs; `workspace` is cuBLASLt's (null without a bias).
  struct GemmPanel {
    std::int64_t m0 = 0, mr = 0, n0 = 0, nr = 0;
    std::int64_t ldx = 0;  // x's row stride in elements
    const void* x = nullptr;
    const void* w = nullptr;
    void* workspace = nullptr;
  };
  void gemm_panel(const GemmArgs& a, const GemmPlan& plan, const GemmPanel& p);
  struct CopyLane {
    cudaStream_t stream = nullptr;
    cudaEvent_t compute_done = nullptr;  // recorded on the compute stream by copies without a fence
  };
  CopyLane& lane();
  // Dynamic shared memory for a kernel: opts in above the default 48 KiB; throws naming `op`
  // when the GPU has less.
  void allow_shared(const void* kernel, std::size_t bytes, const char* op);
  // attention_decode's two paths: queries (all of a's when empty) on the decode kernel with
  // `plan`, and tiles of query runs on tensor cores (decode_runs.h).
  void decode_queries(const AttentionDecodeArgs& a, std::span<const std::int64_t> queries, const DecodePlan& plan);
  void decode_runs_on_mma(const AttentionDecodeArgs& a, std::span<const RunTile> tiles);
  // The queries of a the decode kernel takes (empty: all), in cascade where they have members.
  void decode_on_cuda_cores(const AttentionDecodeArgs& a, std::span<const std::int64_t> queries);
  void decode_cascade(const AttentionDecodeArgs& a, std::span<const std::int64_t> queries,
                      const CascadeLayout& layout);
  void decode_prefix_tasks(const AttentionDecodeArgs& a, const CascadeLayout& layout, float* acc, float* ml);
  // Pool scratch holding a copy of a host array (enqueued on the compute stream).
  template <class T>
  DeviceBuffer upload(std::span<const T> host);
  // Small host arrays (positions, slots, lens) go to the device through pinned staging
  // buffers, so the caller may reuse its array as soon as the op returns: a copy from
  // pageable memory is not guaranteed to have read it by then. Callers hold stage_mu_.
  struct Stage {
    void* host = nullptr;
    std::size_t capacity = 0;
    cudaEvent_t done = nullptr;  // recorded after the upload that read it
  };
  void* stage_for_upload(const void* host, std::size_t bytes);
  void staged_upload_queued();
  std::array<Stage, 16> stages_{};
  std::size_t next_stage_ = 0;
  std::mutex stage_mu_;

  // ---- graph steps (cuda_graphs.cu)
  // An op of a Capture or Replay step: its signature, its host arrays (copies; the op's
  // arguments point at them) and the op, to run eagerly where the step cannot be a graph.
  struct GraphCall {
    explicit GraphCall(OpSignature s) : sig(std::move(s)) {}
    OpSignature sig;
    std::vector<std::vector<std::byte>> host;
    std::function<void()> run;
  };
  // Host array `input` of op `op` goes to byte `offset` of the upload arena.
  struct GraphUpload {
    std::size_t op = 0, input = 0, offset = 0, bytes = 0;
  };
  struct CapturedStep {
    std::vector<OpSignature> ops;
    std::vector<GraphUpload> uploads;
    std::size_t upload_bytes = 0;
    cudaGraphExec_t exec = nullptr;
  };
  // What a Record step measured: the most scratch one op took, and all uploads, in arena bytes.
  struct ArenaNeeds {
    std::size_t scratch = 0, uploads = 0;
  };
  struct GraphState {
    GraphKeys keys;
    GraphMode mode = GraphMode::None;
    std::uint64_t key = 0;
    std::thread::id owner;          // the thread that opened the step: its calls are the step's
    std::deque<GraphCall> calls;    // Capture, Replay: the step's ops so far (never relocated)
    bool in_op = false;             // an op's own work runs: its allocations are op scratch
    bool uploading = false;         // the allocation under way holds an upload
    std::size_t op_scratch = 0;     // Record, Capture: arena bytes the running op took
    ArenaNeeds measuring;           // Record: this step's
    std::map<std::uint64_t, ArenaNeeds> needs;  // per key, from its last Record step
    std::map<std::uint64_t, CapturedStep> graphs;
    CapturedStep capturing;
    std::size_t upload_used = 0;  // Capture: bytes of the upload arena taken
    // The arenas every graph takes op scratch and uploads from (growing them drops the graphs).
    void* scratch = nullptr;
    std::size_t scratch_bytes = 0;
    void* uploads = nullptr;       // device
    void* host_uploads = nullptr;  // pinned, copied to `uploads` before each launch
    std::size_t upload_capacity = 0;
    cudaEvent_t uploads_read = nullptr;  // recorded after that copy
    GraphCounts counts;
  };
  bool graph_active() const { return graph_.mode != GraphMode::None && !graph_.in_op; }
  // Takes an op called in an open step (graph_active()) as the step's mode says and returns
  // true (the caller then returns); false where the caller runs it itself: another thread's.
  // `host`: the members of Args that are host arrays.
  template <class Args, class Run, class... Span>
  bool graph_op(OpSignature sig, const Args& a, Run run, Span Args::*... host);
  template <class T>
  static void keep_host(GraphCall& call, std::span<const T>& span);
  void graph_call(GraphCall& call);
  void record_op(const std::function<void()>& run);
  void capture_op(GraphCall& call);
  void replay_op(GraphCall& call);
  // The step goes on eagerly (recording) after running the ops it took so far.
  void graph_miss();
  // A call that needs the host (a copy, a fence, sampling) or an op a graph does not take:
  // the step's ops so far run and the rest of the step runs eagerly.
  void graph_interrupt();
  void run_calls_eagerly();
  void end_capture();
  void end_replay();
  void launch_graph(const CapturedStep& step);
  void ensure_arenas(const ArenaNeeds& needs);
  void release_graphs() noexcept;
  void* graph_alloc(std::size_t bytes);
  void* pool_alloc(std::size_t bytes);
  bool in_arena(const void* p) const;
  // upload()'s work inside an open step: records (Record), or stages in the upload arena (Capture).
  DeviceBuffer graph_upload(const void* host, std::size_t bytes);
  GraphState graph_;

  int device_ = 0;
  std::string name_;
  int sm_count_ = 1;
  std::size_t shared_optin_ = 48 * 1024;  // most dynamic shared memory a block can opt in to
  std::size_t max_pitch_ = 0;             // of a 2-D copy
  cudaStream_t stream_ = nullptr;
  cudaMemPool_t pool_ = nullptr;
  const CublasApi* blas_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  std::unique_ptr<LtGemms> lt_;  // cuBLASLt's handle and plans, for GEMMs with a bias
  std::mutex cublas_mu_;  // a cuBLAS handle must not be used by two threads at once (nor lt_)
  std::mutex lanes_mu_;
  std::map<std::thread::id, CopyLane> lanes_;
  std::once_flag pin_warning_;
  void* cublas_workspace_ = nullptr;  // fixed (cublasSetWorkspace), so that captured GEMMs use it
  CpuBackend cpu_;  // for sample
  // kernel_use's GEMM counts: [inputs F32, BF16, F16][weight read in place, converted].
  std::array<std::array<std::int64_t, 2>, 3> gemm_calls_{}, gemm_flops_{};
  float* host_logits_ = nullptr;  // pinned, logits_on_host's
  std::size_t host_logits_capacity_ = 0;
};

template <class T>
void CudaBackend::keep_host(GraphCall& call, std::span<const T>& span) {
  std::vector<std::byte>& bytes = call.host.emplace_back(span.size_bytes());
  if (!span.empty()) std::memcpy(bytes.data(), span.data(), span.size_bytes());
  span = std::span<const T>(reinterpret_cast<const T*>(bytes.data()), span.size());
}

template <class Args, class Run, class... Span>
bool CudaBackend::graph_op(OpSignature sig, const Args& a, Run run, Span Args::*... host) {
  if (graph_.owner != std::this_thread::get_id()) return false;
  if (graph_.mode == GraphMode::Record) {
    record_op([&] { run(a); });
    return true;
  }
  GraphCall& call = graph_.calls.emplace_back(std::move(sig));
  Args kept = a;
  (keep_host(call, kept.*host), ...);
  call.run = [run, kept] { run(kept); };
  graph_call(call);
  return true;
}

template <class T>
DeviceBuffer CudaBackend::upload(std::span<const T> host) {
  if (graph_.in_op && !host.empty() && graph_.owner == std::this_thread::get_id())
    return graph_upload(host.data(), host.size_bytes());
  DeviceBuffer buf(*this, host.size_bytes());
  if (host.empty()) return buf;
  std::lock_guard lock(stage_mu_);
  const void* staged = stage_for_upload(host.data(), host.size_bytes());
  FLEXH2O_CUDA_CHECK(cudaMemcpyAsync(buf.data(), staged, host.size_bytes(), cudaMemcpyHostToDevice, stream_));
  staged_upload_queued();
  return buf;
}

}  // namespace flexh2o::kernels::cuda
