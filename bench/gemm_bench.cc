// CPU GEMM of the backend (oneDNN per weight panel over oneTBB) against calling oneDNN's
// matmul directly on the whole problem with its own threads (weights in its preferred layout,
// reordered once: its best case), and against OpenBLAS sgemm, for the fc1 shape of OPT-1.3B
// (n 8192, k 2048) at m = 1, 16, 64 and 1024 rows, in GFLOP/s:
//   f32:  fp32 weights and compute
//   f16w: fp16 weights, fp32 compute (converted per panel)
//   bf16: bf16 compute (native where oneDNN has AVX-512 BF16 or AMX; otherwise the engine
//         emulates it and oneDNN has no bf16 matmul here)
//   int8: oneDNN's u8 x s8 matmul, against the engine's 8-bit group weights (q8: up to 16 rows
//         expanded in registers by the few-row kernel, more rows expanded per panel to fp32
//         for oneDNN; weight-only, the activations stay fp32)
// Usage: bench_gemm [reps]
#include <cblas.h>
#include <fmt/format.h>
#include <omp.h>
#include <tbb/info.h>

#include <cstdlib>
#include <functional>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <random>
#include <vector>

#include "bench/timing.h"
#include "kernels/backend.h"

using namespace flexh2o;
using dnnl::memory;

namespace {

// oneDNN's matmul on the whole problem, weights reordered once into the layout it picks.
class DirectMatmul {
 public:
  DirectMatmul(std::int64_t m, std::int64_t n, std::int64_t k, memory::data_type x_t, memory::data_type w_t,
               const std::vector<float>& x, const std::vector<float>& w)
      : eng_(dnnl::engine::kind::cpu, 0), stream_(eng_) {
    const memory::desc xd({m, k}, x_t, memory::format_tag::ab), yd({m, n}, memory::data_type::f32, memory::format_tag::ab);
    const memory::desc wd({k, n}, w_t, memory::format_tag::any);
    dnnl::primitive_attr attr;
    if (x_t == memory::data_type::u8) attr.set_output_scales(0, {1e-3f});
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(xd, wd, yd), attr, eng_);
    x_ = memory(pd.src_desc(), eng_);
    w_ = memory(pd.weights_desc(), eng_);
    y_ = memory(pd.dst_desc(), eng_);
    fill(x_, x, {m, k}, memory::format_tag::ab);
    fill(w_, w, {k, n}, memory::format_tag::ba);
    matmul_ = dnnl::matmul(pd);
  }
  void operator()() {
    matmul_.execute(stream_, {{DNNL_ARG_SRC, x_}, {DNNL_ARG_WEIGHTS, w_}, {DNNL_ARG_DST, y_}});
    stream_.wait();
  }

 private:
  void fill(memory& dst, const std::vector<float>& values, memory::dims dims, memory::format_tag tag) {
    memory src(memory::desc(dims, memory::data_type::f32, tag), eng_, const_cast<float*>(values.data()));
    dnnl::reorder(src, dst).execute(stream_, src, dst);
    stream_.wait();
  }
  dnnl::engine eng_;
  dnnl::stream stream_;
  memory x_, w_, y_;
  dnnl::matmul matmul_;
};

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 7;
  auto be = kernels::make_cpu_backend();
  const int threads = tbb::info::default_concurrency();
  omp_set_num_threads(threads);  // oneDNN called directly uses every core
  const bool native_bf16 = be->native_bf16();
  const std::int64_t n = 8192, k = 2048;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> w(static_cast<std::size_t>(n * k));
  for (auto& e : w) e = u(rng);
  auto stored = [&](kernels::DType t) {
    std::vector<std::uint8_t> bytes(static_cast<std::size_t>(n * kernels::row_bytes(t, k)));
    kernels::convert_rows(w.data(), kernels::DType::F32, bytes.data(), t, n, k);
    return bytes;
  };
  const auto w16 = stored(kernels::DType::F16), wq8 = stored(kernels::DType::Q8);

  fmt::print("CPU GEMM n {} x k {}, {} threads, median of {} interleaved runs, GFLOP/s (engine / oneDNN direct)\n", n, k,
             threads, reps);
  fmt::print("bf16: {}\n\n", native_bf16 ? "native (oneDNN AVX-512 BF16 / AMX)" : "not native here: the engine emulates it, oneDNN has none");
  fmt::print("| m | OpenBLAS f32 | oneDNN f32 | engine f32 | ratio | engine f16w | oneDNN bf16 | engine bf16 | ratio | "
             "oneDNN u8s8 | engine q8 | ratio |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const std::int64_t m : {1, 16, 64, 1024}) {
    std::vector<float> x(static_cast<std::size_t>(m * k)), y(static_cast<std::size_t>(m * n));
    for (auto& e : x) e = u(rng);
    auto engine = [&](const void* data, kernels::DType dt, kernels::DType compute) {
      return [&, data, dt, compute] { be->gemm({x.data(), m, {data, dt, n, k}, nullptr, y.data(), 0.0f, compute}); };
    };
    auto blas = [&] {
      openblas_set_num_threads(threads);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                  1.0f, x.data(), static_cast<int>(k), w.data(), static_cast<int>(k), 0.0f, y.data(), static_cast<int>(n));
      openblas_set_num_threads(1);
    };
    using dt = memory::data_type;
    DirectMatmul f32(m, n, k, dt::f32, dt::f32, x, w), u8s8(m, n, k, dt::u8, dt::s8, x, w);
    std::optional<DirectMatmul> bf16;
    if (native_bf16) bf16.emplace(m, n, k, dt::bf16, dt::bf16, x, w);
    std::vector<std::function<void()>> variants = {blas,
                                                   std::ref(f32),
                                                   engine(w.data(), kernels::DType::F32, kernels::DType::F32),
                                                   engine(w16.data(), kernels::DType::F16, kernels::DType::F32),
                                                   engine(w16.data(), kernels::DType::F16, kernels::DType::BF16),
                                                   std::ref(u8s8),
                                                   engine(wq8.data(), kernels::DType::Q8, kernels::DType::F32)};
    if (bf16) variants.push_back(std::ref(*bf16));
    const auto t = bench::interleaved_medians(variants, reps);
    const double flop = 2.0 * static_cast<double>(m * n * k);
    auto gf = [&](double sec) { return flop / sec / 1e9; };
    const std::string one_bf16 = bf16 ? fmt::format("{:.1f}", gf(t[7])) : "n/a";
    const std::string bf16_ratio = bf16 ? fmt::format("{:.2f}", t[7] / t[4]) : "n/a";
    fmt::print("| {} | {:.1f} | {:.1f} | {:.1f} | {:.2f} | {:.1f} | {} | {:.1f} | {} | {:.1f} | {:.1f} | {:.2f} |\n", m,
               gf(t[0]), gf(t[1]), gf(t[2]), t[1] / t[2], gf(t[3]), one_bf16, gf(t[4]), bf16_ratio, gf(t[5]), gf(t[6]),
               t[5] / t[6]);
  }
  return 0;
}
