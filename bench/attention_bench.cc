// Decode attention over a KV cache on a backend, by default the CPU at SmolLM2-135M's shape (9
// query heads, 3 kv heads, head_dim 64) with 32 sequences of one context length: each call one
// layer, the layers' caches taken in turn so that, as in a real step, a call reads its cache
// from memory rather than from the cache of the last call (8 layers on the CPU, beyond L3; on
// a GPU enough layers for 512 MiB, beyond L2, at least 2). Per cache dtype and context:
// microseconds per layer call (median of the reps, launches included) and the KV bytes read
// per second. With a GPU backend, also the device's copy bandwidth measured in the same run
// (copy_on_device of one layer's K and V into the next layer's, interleaved with the attention
// calls; bytes read + written per second) and the attention's share of it.
//
// With --chunk N: chunked prefill instead (a prompt continued after cached tokens: each of the
// sequences has N query rows after --prefix cached slots, every row a decode query on its
// sequence's cache row seeing the slots up to its own, AttentionDecodeArgs::cache_rows), as one
// call per layer, or calls of --call-queries queries (the engine's extend() passes at most its
// batch a call). Per cache dtype: microseconds per layer under f32 compute (the decode kernel)
// and bf16 compute (on CUDA, tensor-core tiles for f16/bf16 caches and the head dims the kernel
// has, docs/backends.md), and the useful TFLOP/s of each (4 head_dim per query head and key seen).
// The contexts are unused there.
//
// With --shared-prefix P: decode also with the first min(P, context) slots shared by all the
// sequences (AttentionDecodeArgs::shared_prefixes: read once where the backend does, cascade
// attention), interleaved with the plain calls: microseconds per layer and plain / shared.
// With --window W: decode under a sliding window of W slots (each sequence reads its last W;
// the KV bytes read count those).
// Usage: bench_attention [reps (7)] [contexts (128,256,512,1024)] [dtypes (f16,bf16,f32; q8, q4)]
//        [--backend cpu|cuda] [--seqs 32] [--heads 9] [--kv-heads 3] [--head-dim 64]
//        [--chunk 0 --prefix 1000 --call-queries 0] [--shared-prefix 0] [--window 0]
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <stdexcept>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "bench/timing.h"
#include "kernels/attention.h"
#include "kernels/backend.h"

using namespace flexh2o;

namespace {

struct Options {
  int reps = 7;
  std::string contexts = "128,256,512,1024", dtypes = "f16,bf16,f32", backend = "cpu";
  std::int64_t seqs = 32, heads = 9, kv_heads = 3, head_dim = 64;
  std::int64_t chunk = 0, prefix = 1000, call_queries = 0;  // chunked prefill when chunk > 0
  std::int64_t shared_prefix = 0;                            // decode with a shared prefix too when > 0
  std::int64_t window = 0;                                   // decode's sliding window (0: none)
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

constexpr std::int64_t kCpuLayers = 8, kMaxLayers = 8;
constexpr double kGpuCycleBytes = 512.0 * (1 << 20);
// The random slots written over and over into each cache (their values do not change the time).
constexpr std::int64_t kFillSlots = 16384;

// Fills `bytes` of device memory with copies of `pattern`.
void fill(kernels::Backend& be, void* dst, std::size_t bytes, const std::vector<std::uint8_t>& pattern) {
  for (std::size_t at = 0; at < bytes; at += pattern.size())
    be.copy_to_device(static_cast<std::uint8_t*>(dst) + at, pattern.data(), std::min(pattern.size(), bytes - at));
}

// One layer's keys or values: seqs * kv_heads * len slots of `dtype`.
struct Layer {
  kernels::DeviceBuffer k, v;
};

// `layers` caches of `slots` slots of `dtype`, each filled with copies of kFillSlots random slots.
std::vector<Layer> random_caches(kernels::Backend& be, kernels::DType dtype, std::int64_t slots, std::int64_t head_dim,
                                 std::int64_t layers, std::minstd_rand& rng) {
  const std::int64_t slot_bytes = kernels::kv_slot_bytes(dtype, head_dim);
  const auto cache_bytes = static_cast<std::size_t>(slots * slot_bytes);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  const std::int64_t pattern_slots = std::min(slots, kFillSlots);
  std::vector<float> values(static_cast<std::size_t>(pattern_slots * head_dim));
  for (float& x : values) x = dist(rng);
  std::vector<std::uint8_t> pattern(static_cast<std::size_t>(pattern_slots * slot_bytes));
  kernels::convert_rows(values.data(), kernels::DType::F32, pattern.data(), dtype, pattern_slots, head_dim);
  std::vector<Layer> caches;
  for (std::int64_t l = 0; l < layers; ++l) {
    caches.push_back({kernels::DeviceBuffer(be, cache_bytes), kernels::DeviceBuffer(be, cache_bytes)});
    fill(be, caches.back().k.data(), cache_bytes, pattern);
    fill(be, caches.back().v.data(), cache_bytes, pattern);
  }
  return caches;
}

void bench_case(kernels::Backend& be, const Options& o, kernels::DType dtype, std::int64_t len, std::minstd_rand& rng) {
  const bool gpu = be.kind() != kernels::DeviceKind::Cpu;
  const std::int64_t slots = o.seqs * o.kv_heads * len, slot_bytes = kernels::kv_slot_bytes(dtype, o.head_dim);
  const std::size_t cache_bytes = static_cast<std::size_t>(slots * slot_bytes);
  const double kv_bytes = 2.0 * static_cast<double>(cache_bytes);  // a layer's K and V
  const std::int64_t read_len = o.window > 0 ? std::min(o.window, len) : len;
  const double layer_bytes = kv_bytes * static_cast<double>(read_len) / static_cast<double>(len);  // read
  const std::int64_t layers =
      gpu ? std::clamp<std::int64_t>(static_cast<std::int64_t>(std::ceil(kGpuCycleBytes / kv_bytes)), 2, kMaxLayers)
          : kCpuLayers;
  std::vector<Layer> caches = random_caches(be, dtype, slots, o.head_dim, layers, rng);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<float> q(static_cast<std::size_t>(o.seqs * o.heads * o.head_dim));
  for (float& x : q) x = dist(rng);
  kernels::DeviceBuffer q_dev(be, q.size() * sizeof(float)), out(be, q.size() * sizeof(float));
  be.copy_to_device(q_dev.data(), q.data(), q_dev.bytes());
  const std::vector<std::int64_t> lens(static_cast<std::size_t>(o.seqs), len);
  const kernels::AttentionShape shape{o.heads, o.kv_heads, o.head_dim, 1.0f / std::sqrt(static_cast<float>(o.head_dim)),
                                      0.0f, o.window};
  // Every sequence a member of one shared prefix held by row 0 (the timing does not depend on
  // the values, so the rows need not hold its bytes).
  const std::int64_t shared = std::min(o.shared_prefix, len);
  const std::vector<kernels::SharedPrefix> prefixes = {{0, shared}};
  const std::vector<std::int64_t> prefix_of(static_cast<std::size_t>(o.seqs), 0);
  auto decode = [&](bool grouped) {
    return [&, grouped] {
      for (const Layer& layer : caches)
        be.attention_decode({.shape = shape,
                             .q = q_dev.as<float>(),
                             .k_cache = layer.k.data(),
                             .v_cache = layer.v.data(),
                             .capacity = len,
                             .lens = lens,
                             .out = out.as<float>(),
                             .cache_dtype = dtype,
                             .shared_prefixes = grouped ? std::span(prefixes) : std::span<const kernels::SharedPrefix>{},
                             .prefix_of = grouped ? std::span(prefix_of) : std::span<const std::int64_t>{}});
      be.synchronize();
    };
  };
  std::vector<std::function<void()>> variants = {decode(false)};
  if (gpu)
    variants.push_back([&] {
      be.copy_on_device(caches[1].k.data(), caches[0].k.data(), cache_bytes);
      be.copy_on_device(caches[1].v.data(), caches[0].v.data(), cache_bytes);
      be.synchronize();
    });
  if (shared > 0) variants.push_back(decode(true));
  const std::vector<double> s = bench::interleaved_medians(variants, o.reps);
  const double per_layer = s[0] / static_cast<double>(layers), gbps = layer_bytes / per_layer / 1e9;
  std::string row = fmt::format("| {} | {} | {:.1f} | {:.1f} | {:.1f} |", kernels::dtype_name(dtype), len,
                                layer_bytes / 1e6, per_layer * 1e6, gbps);
  if (gpu) {
    const double copy_gbps = 2.0 * kv_bytes / s[1] / 1e9;  // read + written
    row += fmt::format(" {:.1f} | {:.2f} |", copy_gbps, gbps / copy_gbps);
  }
  if (o.shared_prefix > 0) {
    const double grouped = shared > 0 ? s.back() / static_cast<double>(layers) : per_layer;
    row += fmt::format(" {} | {:.1f} | {:.2f} |", shared, grouped * 1e6, per_layer / grouped);
  }
  fmt::print("{}\n", row);
}

// Chunked prefill (--chunk): o.seqs sequences of o.chunk queries after o.prefix cached slots,
// under f32 and bf16 compute, interleaved.
void bench_chunk_case(kernels::Backend& be, const Options& o, kernels::DType dtype, std::minstd_rand& rng) {
  const bool gpu = be.kind() != kernels::DeviceKind::Cpu;
  const std::int64_t capacity = o.prefix + o.chunk, queries = o.seqs * o.chunk;
  const std::int64_t slots = o.seqs * o.kv_heads * capacity, slot_bytes = kernels::kv_slot_bytes(dtype, o.head_dim);
  const std::size_t cache_bytes = static_cast<std::size_t>(slots * slot_bytes);
  const std::int64_t layers =
      gpu ? std::clamp<std::int64_t>(static_cast<std::int64_t>(std::ceil(kGpuCycleBytes / (2.0 * cache_bytes))), 2, kMaxLayers)
          : 1;
  std::vector<Layer> caches = random_caches(be, dtype, slots, o.head_dim, layers, rng);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<float> q(static_cast<std::size_t>(queries * o.heads * o.head_dim));
  for (float& x : q) x = dist(rng);
  kernels::DeviceBuffer q_dev(be, q.size() * sizeof(float)), out(be, q.size() * sizeof(float));
  be.copy_to_device(q_dev.data(), q.data(), q_dev.bytes());
  std::vector<std::int64_t> lens, rows;
  double keys_seen = 0.0;
  for (std::int64_t b = 0; b < o.seqs; ++b)
    for (std::int64_t i = 0; i < o.chunk; ++i) {
      rows.push_back(b);
      lens.push_back(o.prefix + 1 + i);
      keys_seen += static_cast<double>(lens.back());
    }
  const kernels::AttentionShape shape{o.heads, o.kv_heads, o.head_dim, 1.0f / std::sqrt(static_cast<float>(o.head_dim))};
  const std::int64_t per_call = o.call_queries > 0 ? o.call_queries : queries, width = o.heads * o.head_dim;
  auto run = [&](kernels::DType compute) {
    return [&, compute] {
      for (const Layer& layer : caches)
        for (std::int64_t q0 = 0; q0 < queries; q0 += per_call) {
          const auto first = static_cast<std::size_t>(q0), n = static_cast<std::size_t>(std::min(per_call, queries - q0));
          be.attention_decode({.shape = shape,
                               .q = q_dev.as<float>() + q0 * width,
                               .k_cache = layer.k.data(),
                               .v_cache = layer.v.data(),
                               .capacity = capacity,
                               .lens = std::span<const std::int64_t>(lens).subspan(first, n),
                               .out = out.as<float>() + q0 * width,
                               .cache_dtype = dtype,
                               .cache_rows = std::span<const std::int64_t>(rows).subspan(first, n),
                               .compute = compute});
        }
      be.synchronize();
    };
  };
  const std::vector<double> s = bench::interleaved_medians({run(kernels::DType::F32), run(kernels::DType::BF16)}, o.reps);
  const double flops = 4.0 * static_cast<double>(o.head_dim * o.heads) * keys_seen;
  const double f32 = s[0] / static_cast<double>(layers), bf16 = s[1] / static_cast<double>(layers);
  fmt::print("| {} | {} | {} | {:.1f} | {:.3g} | {:.1f} | {:.3g} | {:.2f} |\n", kernels::dtype_name(dtype), o.chunk,
             o.prefix, f32 * 1e6, flops / f32 / 1e12, bf16 * 1e6, flops / bf16 / 1e12, f32 / bf16);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"decode attention: microseconds per layer and KV GB/s"};
  app.add_option("reps", o.reps, "measured rounds; medians are reported")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("contexts", o.contexts, "context lengths, comma-separated")->capture_default_str();
  app.add_option("dtypes", o.dtypes, "cache dtypes, comma-separated (f32, f16, bf16, q8, q4)")->capture_default_str();
  app.add_option("--backend", o.backend, "cpu or cuda")->capture_default_str();
  app.add_option("--seqs", o.seqs, "sequences per call")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--heads", o.heads, "query heads")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--kv-heads", o.kv_heads, "kv heads (divide the query heads)")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--head-dim", o.head_dim, "head_dim")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--chunk", o.chunk, "chunked prefill: query rows per sequence after --prefix cached slots (0: decode)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--prefix", o.prefix, "chunked prefill: cached slots before the chunk")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--call-queries", o.call_queries, "chunked prefill: queries per call (0: all in one)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--shared-prefix", o.shared_prefix, "decode: also with this many first slots shared by all sequences")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--window", o.window, "decode: a sliding window of this many slots (0: none)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  if (o.heads % o.kv_heads != 0) {
    fmt::print(stderr, "bench_attention: --kv-heads {} does not divide --heads {}\n", o.kv_heads, o.heads);
    return 2;
  }
  std::unique_ptr<kernels::Backend> be;
  std::vector<kernels::DType> dtypes;
  std::vector<std::int64_t> contexts;
  try {
    be = kernels::make_backend(o.backend);
    for (const std::string& name : split(o.dtypes)) {
      const kernels::DType t = kernels::parse_dtype(name);
      if (t == kernels::DType::Q4G32 || t == kernels::DType::Q8G32)
        throw std::invalid_argument("a KV cache is never " + name + " (expected f32, f16, bf16, q8 or q4)");
      dtypes.push_back(t);
    }
    for (const std::string& c : split(o.contexts)) contexts.push_back(std::stoll(c));
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_attention: {}\n", e.what());
    return 2;
  }
  const bool gpu = be->kind() != kernels::DeviceKind::Cpu;
  std::minstd_rand rng(1);
  if (o.chunk > 0) {
    fmt::print("chunked prefill attention on {}, {} sequences, {} query / {} kv heads, head_dim {}, {} queries a call, "
               "median of {}\n",
               be->name(), o.seqs, o.heads, o.kv_heads, o.head_dim,
               o.call_queries > 0 ? o.call_queries : o.seqs * o.chunk, o.reps);
    fmt::print("| cache | chunk | prefix | f32 compute us per layer | TFLOP/s | bf16 compute us per layer | TFLOP/s | "
               "f32 / bf16 |\n|---|---|---|---|---|---|---|---|\n");
    for (kernels::DType dtype : dtypes) bench_chunk_case(*be, o, dtype, rng);
    return 0;
  }
  fmt::print("decode attention on {}, {} sequences, {} query / {} kv heads, head_dim {}, median of {}\n", be->name(),
             o.seqs, o.heads, o.kv_heads, o.head_dim, o.reps);
  const bool with_shared = o.shared_prefix > 0;
  fmt::print("| cache | context | KV MB per layer | us per layer | KV GB/s |{}{}\n|---|---|---|---|---|{}{}\n",
             gpu ? " copy GB/s (read + write) | attention / copy |" : "",
             with_shared ? " shared prefix | us per layer, shared | plain / shared |" : "", gpu ? "---|---|" : "",
             with_shared ? "---|---|---|" : "");
  for (kernels::DType dtype : dtypes)
    for (std::int64_t len : contexts) {
      if (len <= 0) {
        fmt::print(stderr, "bench_attention: context {} is not positive\n", len);
        return 2;
      }
      bench_case(*be, o, dtype, len, rng);
    }
  return 0;
}
