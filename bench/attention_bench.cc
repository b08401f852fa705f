// Decode attention over a KV cache on the CPU backend at SmolLM2-135M's shape (9 query heads,
// 3 kv heads, head_dim 64): 32 sequences of one context length, each call one layer, the layers'
// caches taken in turn so that, as in a real step, a call reads its cache from memory rather
// than from the cache of the last call. Per cache dtype and context: microseconds per layer
// call (median of the reps) and the cache bytes read per second.
// Usage: bench_attention [reps (7)] [contexts (128,256,512,1024)] [dtypes (f16,bf16,f32)]
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/timing.h"
#include "kernels/attention.h"
#include "kernels/backend.h"

using namespace flexh2o;

namespace {

constexpr std::int64_t kSeqs = 32, kHeads = 9, kKvHeads = 3, kHeadDim = 64;
// Layers' caches cycled through: at a context of 128 in f16 they are 8 x 6 MiB, beyond L3.
constexpr std::int64_t kLayers = 8;

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

// A layer's keys and values for kSeqs sequences of `len` slots, in `dtype`, from random fp32.
std::vector<std::uint8_t> random_cache(std::minstd_rand& rng, kernels::DType dtype, std::int64_t len) {
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<float> values(static_cast<std::size_t>(kSeqs * kKvHeads * len * kHeadDim));
  for (float& v : values) v = dist(rng);
  const std::int64_t rows = kSeqs * kKvHeads * len;
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(rows * kernels::kv_slot_bytes(dtype, kHeadDim)));
  kernels::convert_rows(values.data(), kernels::DType::F32, bytes.data(), dtype, rows, kHeadDim);
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 7;
  const std::vector<std::string> contexts = split(argc > 2 ? argv[2] : "128,256,512,1024");
  const std::vector<std::string> dtypes = split(argc > 3 ? argv[3] : "f16,bf16,f32");
  auto be = kernels::make_cpu_backend();
  std::minstd_rand rng(1);
  const kernels::AttentionShape shape{kHeads, kKvHeads, kHeadDim, 1.0f / std::sqrt(static_cast<float>(kHeadDim))};
  fmt::print("decode attention, {} sequences, {} query / {} kv heads, head_dim {}, {} layers' caches in turn, median of {}\n",
             kSeqs, kHeads, kKvHeads, kHeadDim, kLayers, reps);
  fmt::print("| cache | context | us per layer | cache GB/s |\n|---|---|---|---|\n");
  for (const std::string& name : dtypes) {
    const kernels::DType dtype = kernels::parse_float_dtype(name);
    for (const std::string& c : contexts) {
      const std::int64_t len = std::atoll(c.c_str());
      std::vector<std::vector<std::uint8_t>> k, v;
      for (std::int64_t l = 0; l < kLayers; ++l) {
        k.push_back(random_cache(rng, dtype, len));
        v.push_back(random_cache(rng, dtype, len));
      }
      std::vector<float> q(static_cast<std::size_t>(kSeqs * kHeads * kHeadDim), 0.1f), out(q.size());
      const std::vector<std::int64_t> lens(static_cast<std::size_t>(kSeqs), len);
      const double s = bench::interleaved_medians({[&] {
                                                    for (std::int64_t l = 0; l < kLayers; ++l)
                                                      be->attention_decode({.shape = shape,
                                                                            .q = q.data(),
                                                                            .k_cache = k[l].data(),
                                                                            .v_cache = v[l].data(),
                                                                            .capacity = len,
                                                                            .lens = lens,
                                                                            .out = out.data(),
                                                                            .cache_dtype = dtype});
                                                  }},
                                                  reps)[0] /
                       kLayers;
      const double bytes = 2.0 * static_cast<double>(k[0].size());
      fmt::print("| {} | {} | {:.1f} | {:.1f} |\n", name, len, s * 1e6, bytes / s / 1e9);
    }
  }
  return 0;
}
