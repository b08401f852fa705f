#include "kernels/cuda/gemm_lt.h"

#include <algorithm>

#include "kernels/cuda/cuda_check.h"

namespace flexh2o::kernels::cuda {

namespace {

// Plans kept at most (continuous batching's steps vary the row count): past this the cache
// starts again rather than grow with every shape a long job meets.
constexpr std::size_t kMaxPlans = 256;
// Bounds of the shapes handed to cuBLASLt (as PyTorch's bias epilogue keeps them): beyond
// 65535 * 32 some of its kernels' grids overflow; a dimension of 1 is a GEMV, which it takes
// less well than cuBLAS does.
constexpr std::int64_t kMaxDim = std::int64_t{65535} * 32;
// Its bias loads are vectorised: a bias that is not 16-byte aligned stays out.
constexpr std::uintptr_t kBiasAlignment = 16;

std::uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t low = a & (~a + 1);  // the lowest set bit
  return static_cast<std::uint32_t>(a == 0 ? 256 : std::min<std::uintptr_t>(low, 256));
}

cudaDataType_t cuda_type(DType t) {
  if (t == DType::BF16) return CUDA_R_16BF;
  return t == DType::F16 ? CUDA_R_16F : CUDA_R_32F;
}

}  // namespace

LtGemms::LtGemms(const CublasApi& api) : api_(api) { FLEXH2O_CUBLAS_CHECK(api_.lt_create(&handle_)); }

LtGemms::~LtGemms() {
  for (auto& [key, plan] : plans_) destroy(plan);
  (void)api_.lt_destroy(handle_);
}

void LtGemms::destroy(Plan& p) noexcept {
  if (p.y) (void)api_.lt_layout_destroy(p.y);
  if (p.x) (void)api_.lt_layout_destroy(p.x);
  if (p.w) (void)api_.lt_layout_destroy(p.w);
  if (p.op) (void)api_.lt_desc_destroy(p.op);
  p = Plan{};
}

LtGemms::Plan LtGemms::make_plan(const Key& key) {
  const auto [inputs, m, n, k, ldx, ldy, align_w, align_x, align_y] = key;
  Plan p;
  cublasLtMatmulPreference_t pref = nullptr;
  try {
    FLEXH2O_CUBLAS_CHECK(api_.lt_desc_create(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const std::int32_t bias_type = CUDA_R_32F;
    FLEXH2O_CUBLAS_CHECK(api_.lt_desc_set(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa));
    FLEXH2O_CUBLAS_CHECK(api_.lt_desc_set(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof transb));
    FLEXH2O_CUBLAS_CHECK(api_.lt_desc_set(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    FLEXH2O_CUBLAS_CHECK(api_.lt_desc_set(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type));
    const auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
    FLEXH2O_CUBLAS_CHECK(api_.lt_layout_create(&p.w, cuda_type(inputs), u(k), u(n), k));
    FLEXH2O_CUBLAS_CHECK(api_.lt_layout_create(&p.x, cuda_type(inputs), u(k), u(m), ldx));
    FLEXH2O_CUBLAS_CHECK(api_.lt_layout_create(&p.y, CUDA_R_32F, u(n), u(m), ldy));
    FLEXH2O_CUBLAS_CHECK(api_.lt_pref_create(&pref));
    const std::uint64_t workspace = kGemmLtWorkspaceBytes;
    FLEXH2O_CUBLAS_CHECK(
        api_.lt_pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace));
    // Only algorithms that work with the pointers as aligned as they are (the default assumes 256 bytes).
    for (const auto& [attr, bytes] : {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_w},
                                     std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_x},
                                     std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_y},
                                     std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_y}})
      FLEXH2O_CUBLAS_CHECK(api_.lt_pref_set(pref, attr, &bytes, sizeof bytes));
    cublasLtMatmulHeuristicResult_t best{};
    int found = 0;
    const cublasStatus_t s = api_.lt_heuristic(handle_, p.op, p.w, p.x, p.y, p.y, pref, 1, &best, &found);
    p.usable = s == CUBLAS_STATUS_SUCCESS && found > 0 && best.state == CUBLAS_STATUS_SUCCESS &&
               best.workspaceSize <= workspace;
    p.algo = best.algo;
  } catch (...) {
    if (pref) (void)api_.lt_pref_destroy(pref);
    destroy(p);
    throw;
  }
  (void)api_.lt_pref_destroy(pref);
  return p;
}

bool LtGemms::run(const LtBiasGemm& g, void* workspace, cudaStream_t stream) {
  const auto within = [](std::int64_t d) { return d > 1 && d < kMaxDim; };
  if (!within(g.m) || !within(g.n) || !within(g.k) || g.bias == nullptr ||
      reinterpret_cast<std::uintptr_t>(g.bias) % kBiasAlignment != 0)
    return false;
  const Key key{g.inputs, g.m, g.n, g.k, g.ldx, g.ldy, alignment(g.w), alignment(g.x), alignment(g.y)};
  auto it = plans_.find(key);
  if (it == plans_.end()) {
    if (plans_.size() >= kMaxPlans) {
      for (auto& [k, plan] : plans_) destroy(plan);
      plans_.clear();
    }
    it = plans_.emplace(key, make_plan(key)).first;
  }
  Plan& p = it->second;
  if (!p.usable) return false;
  // The bias is read when the GEMM is enqueued, so one descriptor serves every call of its shape.
  FLEXH2O_CUBLAS_CHECK(api_.lt_desc_set(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias));
  const float one = 1.0f;
  FLEXH2O_CUBLAS_CHECK(api_.lt_matmul(handle_, p.op, &one, g.w, p.w, g.x, p.x, &g.beta, g.y, p.y, g.y, p.y, &p.algo,
                                      workspace, static_cast<std::size_t>(kGemmLtWorkspaceBytes), stream));
  return true;
}

}  // namespace flexh2o::kernels::cuda
