// CPU GEMM of the backend (panels over oneTBB, fp16/bf16 converted per panel) against
// calling multi-threaded OpenBLAS directly (sgemv for one row, else sgemm) on the same
// shapes with fp32 weights.
// Usage: bench_gemm [reps]
#include <cblas.h>
#include <fmt/format.h>
#include <tbb/info.h>

#include <cstdlib>
#include <random>
#include <vector>

#include "bench/timing.h"
#include "kernels/backend.h"

using namespace flexh2o;

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 7;
  auto be = kernels::make_cpu_backend();  // sets OpenBLAS to one thread for its own use
  const int threads = tbb::info::default_concurrency();
  struct Shape {
    const char* what;
    std::int64_t m, n, k;
  };
  // OPT-1.3B projections (hidden 2048, ffn 8192) at decode batch 1/16 and a 512-token prefill.
  const Shape shapes[] = {{"qkv/o decode b1", 1, 2048, 2048},   {"fc1 decode b1", 1, 8192, 2048},
                          {"fc2 decode b16", 16, 2048, 8192},   {"fc1 decode b16", 16, 8192, 2048},
                          {"fc1 prefill 512", 512, 8192, 2048}, {"fc2 prefill 512", 512, 2048, 8192}};
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  fmt::print("CPU GEMM, {} threads, median of {} interleaved runs (GFLOP/s)\n", threads, reps);
  fmt::print("| shape | m | n | k | OpenBLAS f32 | flexh2o f32 | ratio | flexh2o f16 | ratio | flexh2o bf16 | ratio |\n");
  fmt::print("|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& s : shapes) {
    std::vector<float> x(static_cast<std::size_t>(s.m * s.k)), w(static_cast<std::size_t>(s.n * s.k)),
        y(static_cast<std::size_t>(s.m * s.n));
    for (auto& e : x) e = u(rng);
    for (auto& e : w) e = u(rng);
    std::vector<std::uint16_t> w16(w.size()), wbf(w.size());
    kernels::convert_from_f32(w.data(), kernels::DType::F16, w16.data(), w.size());
    kernels::convert_from_f32(w.data(), kernels::DType::BF16, wbf.data(), w.size());
    auto ours = [&](const void* data, kernels::DType dt) {
      return [&, data, dt] { be->gemm({x.data(), s.m, {data, dt, s.n, s.k}, nullptr, y.data(), 0.0f}); };
    };
    auto blas = [&] {
      openblas_set_num_threads(threads);
      if (s.m == 1)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(s.n), static_cast<int>(s.k), 1.0f, w.data(),
                    static_cast<int>(s.k), x.data(), 1, 0.0f, y.data(), 1);
      else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(s.m), static_cast<int>(s.n),
                  static_cast<int>(s.k), 1.0f, x.data(), static_cast<int>(s.k), w.data(), static_cast<int>(s.k), 0.0f,
                  y.data(), static_cast<int>(s.n));
      openblas_set_num_threads(1);
    };
    const auto t = bench::interleaved_medians(
        {blas, ours(w.data(), kernels::DType::F32), ours(w16.data(), kernels::DType::F16), ours(wbf.data(), kernels::DType::BF16)},
        reps);
    const double flop = 2.0 * static_cast<double>(s.m * s.n * s.k);
    auto gf = [&](double sec) { return flop / sec / 1e9; };
    fmt::print("| {} | {} | {} | {} | {:.1f} | {:.1f} | {:.2f} | {:.1f} | {:.2f} | {:.1f} | {:.2f} |\n", s.what, s.m, s.n,
               s.k, gf(t[0]), gf(t[1]), t[0] / t[1], gf(t[2]), t[0] / t[2], gf(t[3]), t[0] / t[3]);
  }
  return 0;
}
