#include "engine/job/calibrate.h"

#include "engine/job/calibrate_units.h"
#include "engine/job/plan_job.h"
#include "engine/runtime/machine_profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <thread>
#include <vector>

#include <sys/statvfs.h>
#include <unistd.h>

#include <tbb/parallel_for.h>

#include "engine/model/model_config.h"
#include "engine/loaders/model_source.h"
#include "kernels/attention.h"
#include "kernels/backend.h"
#include "kernels/quantize.h"
#include "offload/budget.h"
#include "offload/copy_engine.h"
#include "offload/host_memory.h"
#include "offload/tiers.h"
#include "policy/hardware_profile.h"

namespace flexh2o::job {

namespace {

using Clock = std::chrono::steady_clock;
using kernels::Backend;
using kernels::DeviceBuffer;
namespace off = flexh2o::offload;

constexpr std::int64_t kMiB = std::int64_t{1} << 20;
// Copies move in chunks of this size, like the engine's weight and KV transfers.
constexpr std::int64_t kChunk = 64 * kMiB;

// How long and how large each measurement is.
struct Plan {
  double min_seconds;                   // each rate is timed over at least this long
  std::vector<std::int64_t> prefill_m;  // GEMM rows at prefill (tokens of a batch)
  std::vector<std::int64_t> decode_m;   // GEMM rows at decode (sequences of a batch)
  std::int64_t gemm_n, gemm_k;          // weight [n, k], fp16
  std::int64_t attn_prefill_seqs, attn_prefill_len;
  std::int64_t attn_decode_seqs;
  std::vector<std::int64_t> attn_decode_lens;  // cached tokens: the rate's curve
  std::int64_t heads, kv_heads, head_dim;
  kernels::DType cache_dtype;  // the KV cache as runs keep it by default: the model's float dtype
  kernels::DType weight_dtype;  // the GEMMs' matrices: the model's dtype (f16 without --model)
  std::int64_t memory_bytes;  // cpu <-> gpu copies per pass
  std::int64_t disk_bytes;    // disk <-> cpu, one pass each way
};

Plan make_plan(bool quick) {
  const auto f16 = kernels::DType::F16;
  if (quick) return {0.05, {512}, {16}, 2048, 2048, 2, 256, 8, {256}, 16, 16, 128, f16, f16, 128 * kMiB, 128 * kMiB};
  return {0.4,  {512, 1024, 2048}, {8, 16, 32}, 2048, 2048, 4, 512, 8, {64, 256, 1024}, 16, 16, 128, f16, f16,
          512 * kMiB, 512 * kMiB};
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

template <class F>
double time_per_call(F&& fn, double min_seconds) {
  fn();
  double best = std::numeric_limits<double>::infinity();
  for (int window = 0; window < 3; ++window) {
    int calls = 0;
    const auto t0 = Clock::now();
    double elapsed = 0;
    do {
      fn();
      ++calls;
      elapsed = seconds_since(t0);
    } while (elapsed < min_seconds / 3);
    best = std::min(best, elapsed / calls);
  }
  return best;
}

// Keeps 4 significant digits, so the profile reads like a measurement, not noise.
double round_sig(double v) {
  if (!(v > 0) || !std::isfinite(v)) return v;
  const double scale = std::pow(10.0, 3 - std::floor(std::log10(v)));
  return std::round(v * scale) / scale;
}

std::string mib(std::int64_t bytes) { return fmt::format("{} MiB", bytes / kMiB); }

// Measurements taken for a run's planner (decode_attention_curve) say nothing.
thread_local bool silent = false;

// Silent while it lives (also when a measurement throws).
struct Silence {
  Silence() { silent = true; }
  ~Silence() { silent = false; }
  Silence(const Silence&) = delete;
  Silence& operator=(const Silence&) = delete;
};

// One line per measurement on stderr, e.g. "calibrate: disk->cpu 512 MiB ... 0.91 GB/s".
void progress(const std::string& what, const std::string& result) {
  if (!silent) fmt::print(stderr, "calibrate: {} ... {}\n", what, result);
}

std::string gflops(double flops_per_s) { return fmt::format("{:.3g} GFLOP/s", flops_per_s / 1e9); }
std::string gbps(double bytes_per_s) { return fmt::format("{:.3g} GB/s", bytes_per_s / 1e9); }

// Small deterministic values with some spread (a repeated pseudo-random pattern; cheap to
// fill hundreds of MiB and free of denormals).
void fill(float* p, std::int64_t n, std::uint32_t seed) {
  std::array<float, 4093> pattern{};
  std::uint32_t s = seed * 2654435761u + 1;
  for (float& v : pattern) {
    s = s * 1664525u + 1013904223u;
    v = static_cast<float>(s >> 8) / static_cast<float>(1u << 24) - 0.5f;
  }
  for (std::int64_t i = 0; i < n; ++i) p[i] = pattern[static_cast<std::size_t>(i) % pattern.size()];
}

DeviceBuffer device_floats(Backend& be, std::int64_t n, std::uint32_t seed) {
  std::vector<float> host(static_cast<std::size_t>(n));
  fill(host.data(), n, seed);
  DeviceBuffer d(be, host.size() * sizeof(float));
  be.copy_to_device(d.data(), host.data(), d.bytes());
  return d;
}

// ---- Compute -----------------------------------------------------------------------------

// flop/s of y[m, n] = x[m, k] @ w[n, k]^T over the given row counts, with the weights in the
// model's dtype (as the engine stores them), each count multiplied in the compute dtype a run
// gives it (`compute_at`): total flops over total time.
double gemm_rate(Backend& be, const Plan& plan, const std::vector<std::int64_t>& ms, const char* phase,
                 const engine::GemmDtypeAt& compute_at) {
  const std::int64_t n = plan.gemm_n, k = plan.gemm_k;
  std::vector<float> wf(static_cast<std::size_t>(n * k));
  fill(wf.data(), n * k, 1);
  std::vector<std::byte> stored(static_cast<std::size_t>(n * kernels::row_bytes(plan.weight_dtype, k)));
  kernels::convert_from_f32(wf.data(), plan.weight_dtype, stored.data(), wf.size());
  DeviceBuffer w(be, stored.size());
  be.copy_to_device(w.data(), stored.data(), w.bytes());
  const std::int64_t max_m = *std::max_element(ms.begin(), ms.end());
  DeviceBuffer x = device_floats(be, max_m * k, 2);
  DeviceBuffer y(be, static_cast<std::size_t>(max_m * n) * sizeof(float));

  double flops = 0, seconds = 0;
  for (std::int64_t m : ms) {
    kernels::GemmArgs a;
    a.x = x.as<float>();
    a.m = m;
    a.w = {w.data(), plan.weight_dtype, n, k};
    a.y = y.as<float>();
    a.compute = compute_at(m);
    const double t = time_per_call(
        [&] {
          be.gemm(a);
          be.synchronize();
        },
        plan.min_seconds);
    const double f = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
    progress(fmt::format("gemm {} m={} n=k={} {} weights, {} compute", phase, m, n, kernels::dtype_name(plan.weight_dtype),
                         kernels::dtype_name(a.compute)),
             gflops(f / t));
    flops += f;
    seconds += t;
  }
  return flops / seconds;
}

// flop/s of causal prefill attention, counted as FlexGen does: 4 * s^2 * h per sequence
// (QK^T and PV over the full square, though causal attention computes about half of it), in
// the compute dtype a job of that many sequences gets (on a GPU, bf16 runs the tensor-core kernel).
double attention_prefill_rate(Backend& be, const Plan& plan, const engine::GemmDtypeAt& compute_at) {
  const std::int64_t b = plan.attn_prefill_seqs, s = plan.attn_prefill_len, h = plan.heads * plan.head_dim;
  const std::int64_t rows = b * s;
  DeviceBuffer q = device_floats(be, rows * h, 3), k = device_floats(be, rows * h, 4),
               v = device_floats(be, rows * h, 5);
  DeviceBuffer out(be, static_cast<std::size_t>(rows * h) * sizeof(float));
  std::vector<std::int64_t> offsets;
  for (std::int64_t i = 0; i <= b; ++i) offsets.push_back(i * s);
  kernels::AttentionPrefillArgs a;
  a.shape = {plan.heads, plan.heads, plan.head_dim, 1.0f / std::sqrt(static_cast<float>(plan.head_dim))};
  a.q = q.as<float>();
  a.k = k.as<float>();
  a.v = v.as<float>();
  a.out = out.as<float>();
  a.seq_offsets = offsets;
  a.compute = compute_at(b);
  const double t = time_per_call(
      [&] {
        be.attention_prefill(a);
        be.synchronize();
      },
      plan.min_seconds);
  const double rate =
      4.0 * static_cast<double>(b) * static_cast<double>(s) * static_cast<double>(s) * static_cast<double>(h) / t;
  progress(fmt::format("attention prefill {} x {} tokens, h={}, {} compute", b, s, h, kernels::dtype_name(a.compute)),
           gflops(rate));
  return rate;
}

// `slots` KV slots in the plan's cache dtype. Any bytes are valid f16/bf16 values to attend
// over except NaN/Inf patterns: the cache is filled by converting fp32 values, as runs write it.
std::vector<std::byte> stored_slots(const Plan& plan, std::int64_t slots, std::uint32_t seed) {
  std::vector<float> values(static_cast<std::size_t>(slots * plan.head_dim));
  fill(values.data(), slots * plan.head_dim, seed);
  const std::int64_t bytes = slots * kernels::kv_slot_bytes(plan.cache_dtype, plan.head_dim);
  std::vector<std::byte> stored(static_cast<std::size_t>(bytes));
  kernels::convert_rows(values.data(), kernels::DType::F32, stored.data(), plan.cache_dtype, slots, plan.head_dim);
  return stored;
}

// The plan's decode attention shape: its query and kv heads, 1 / sqrt(head_dim).
kernels::AttentionShape decode_shape(const Plan& plan) {
  return {plan.heads, plan.kv_heads, plan.head_dim, 1.0f / std::sqrt(static_cast<float>(plan.head_dim))};
}

// The sequences of a decode attention call over `len` cached tokens: as many as the plan's copy
// size holds the K and V of (at least the plan's count), so that the call reads them from memory
// as a job's step does. A step's batch reads K/V far larger than any cache; 8 sequences' fit the
// last level, where they read 2-3x faster than a job's.
std::int64_t decode_seqs(const Plan& plan, std::int64_t len) {
  const std::int64_t seq_bytes = 2 * plan.kv_heads * len * kernels::kv_slot_bytes(plan.cache_dtype, plan.head_dim);
  return std::max(plan.attn_decode_seqs, plan.memory_bytes / seq_bytes);
}

// `copies` copies of `unit` in one device buffer (the timings do not depend on the values).
DeviceBuffer tiled_on_device(Backend& be, const std::vector<std::byte>& unit, std::int64_t copies) {
  std::vector<std::byte> host(unit.size() * static_cast<std::size_t>(copies));
  for (std::int64_t i = 0; i < copies; ++i)
    std::copy(unit.begin(), unit.end(), host.begin() + static_cast<std::ptrdiff_t>(unit.size()) * i);
  DeviceBuffer d(be, host.size());
  be.copy_to_device(d.data(), host.data(), host.size());
  return d;
}

// flop/s of decode attention over `len` cached tokens in the plan's KV dtype, counted as
// FlexGen does: 4 * len * h per new token (h = query heads x head_dim).
double attention_decode_rate(Backend& be, const Plan& plan, std::int64_t len) {
  const std::int64_t b = decode_seqs(plan, len), h = plan.heads * plan.head_dim;
  DeviceBuffer q = device_floats(be, b * h, 6);
  const std::vector<std::byte> one_seq = stored_slots(plan, plan.kv_heads * len, 7);
  DeviceBuffer kc = tiled_on_device(be, one_seq, b), vc = tiled_on_device(be, one_seq, b);
  DeviceBuffer out(be, static_cast<std::size_t>(b * h) * sizeof(float));
  const std::vector<std::int64_t> lens(static_cast<std::size_t>(b), len);
  kernels::AttentionDecodeArgs a;
  a.shape = decode_shape(plan);
  a.q = q.as<float>();
  a.k_cache = kc.data();
  a.v_cache = vc.data();
  a.capacity = len;
  a.lens = lens;
  a.out = out.as<float>();
  a.cache_dtype = plan.cache_dtype;
  const double t = time_per_call(
      [&] {
        be.attention_decode(a);
        be.synchronize();
      },
      plan.min_seconds);
  const double rate = 4.0 * static_cast<double>(b) * static_cast<double>(len) * static_cast<double>(h) / t;
  progress(fmt::format("attention decode {} seqs x {} cached, {} heads x {}, {} cache", b, len, plan.heads,
                       plan.head_dim, kernels::dtype_name(plan.cache_dtype)),
           gflops(rate));
  return rate;
}

// HardwareProfile::gpu_attn_decode_read_share: decode attention of kReadShareSeqs sequences
// over the plan's longest length, through as many layers' caches in turn as the plan's copy
// size holds, so that each call reads its cache from memory as a step's layers do, plainly
// and with every sequence's slots but its last a prefix the call's sequences share (read once:
// cascade attention). Per sequence a plain call takes read + compute and a shared one
// read / m + compute, so read / (read + compute) = m / (m - 1) x (1 - t_shared / t_plain).
constexpr std::int64_t kReadShareSeqs = 32;
double attention_read_share(Backend& be, const Plan& plan) {
  const std::int64_t m = kReadShareSeqs, len = plan.attn_decode_lens.back(), h = plan.heads * plan.head_dim;
  const std::vector<std::byte> stored = stored_slots(plan, m * plan.kv_heads * len, 8);
  const auto bytes = static_cast<std::int64_t>(stored.size());
  const std::int64_t layers = std::clamp<std::int64_t>(plan.memory_bytes / (2 * bytes), 2, 64);
  std::vector<DeviceBuffer> caches;
  for (std::int64_t i = 0; i < 2 * layers; ++i) {
    caches.emplace_back(be, stored.size());
    be.copy_to_device(caches.back().data(), stored.data(), stored.size());
  }
  DeviceBuffer q = device_floats(be, m * h, 9), out(be, static_cast<std::size_t>(m * h) * sizeof(float));
  const std::vector<std::int64_t> lens(static_cast<std::size_t>(m), len), prefix_of(static_cast<std::size_t>(m), 0);
  // Row 0 holds the prefix (the timing does not depend on the values: the other rows need not
  // hold its bytes).
  const std::vector<kernels::SharedPrefix> prefix = {{0, len - 1}};
  auto pass = [&](bool shared) {
    for (std::int64_t l = 0; l < layers; ++l) {
      kernels::AttentionDecodeArgs a{.shape = decode_shape(plan),
                                     .q = q.as<float>(),
                                     .k_cache = caches[static_cast<std::size_t>(2 * l)].data(),
                                     .v_cache = caches[static_cast<std::size_t>(2 * l + 1)].data(),
                                     .capacity = len,
                                     .lens = lens,
                                     .out = out.as<float>(),
                                     .cache_dtype = plan.cache_dtype};
      if (shared) {
        a.shared_prefixes = prefix;
        a.prefix_of = prefix_of;
      }
      be.attention_decode(a);
    }
    be.synchronize();
  };
  const double plain = time_per_call([&] { pass(false); }, plan.min_seconds);
  const double once = time_per_call([&] { pass(true); }, plan.min_seconds);
  const double md = static_cast<double>(m), share = std::clamp(md / (md - 1) * (1 - once / plain), 0.0, 1.0);
  progress(fmt::format("attention decode {} seqs x {} cached over {} layers' caches, plain {:.0f} us, {} shared "
                       "read once {:.0f} us",
                       m, len, layers, plain / static_cast<double>(layers) * 1e6, len - 1,
                       once / static_cast<double>(layers) * 1e6),
           fmt::format("read share {:.2f}", share));
  return round_sig(share);
}

// The decode attention curve over the plan's lengths.
policy::RateCurve attention_decode_curve(Backend& be, const Plan& plan) {
  policy::RateCurve curve;
  for (std::int64_t len : plan.attn_decode_lens) curve.emplace_back(len, round_sig(attention_decode_rate(be, plan, len)));
  return curve;
}

// ---- Transfers ---------------------------------------------------------------------------

// Bytes/s of moving `bytes` in kChunk copies through one CopyEngine lane (the engine's
// transfer path): `place_dst/place_src(offset)` name the two ends of each chunk.
template <class Dst, class Src>
double lane_pass(off::CopyEngine& engine, int lane, std::int64_t bytes, Dst place_dst, Src place_src) {
  std::vector<off::CopyTicket> tickets;
  const auto t0 = Clock::now();
  for (std::int64_t o = 0; o < bytes; o += kChunk)
    tickets.push_back(engine.copy(lane, place_dst(o), place_src(o), std::min(kChunk, bytes - o), {"calibrate", ""}));
  // Every ticket is waited on, even after an error, so no copy outlives the buffers.
  std::exception_ptr error;
  for (const auto& t : tickets) {
    try {
      t.wait();
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
  return seconds_since(t0);
}

// Bytes/s of 4-bit rows (of the GEMM width) expanded to fp32 by all threads, a panel of 64
// rows per task into thread-local scratch, as the CPU GEMM does with compressed weights.
double dequant_rate(const Plan& plan) {
  const std::int64_t cols = plan.gemm_k, rows = std::max<std::int64_t>(64, plan.memory_bytes / 8 / cols);
  const std::int64_t row_bytes = kernels::row_bytes(kernels::DType::Q4, cols);
  std::vector<float> x(static_cast<std::size_t>(cols));
  for (std::int64_t i = 0; i < cols; ++i) x[static_cast<std::size_t>(i)] = std::sin(static_cast<float>(i));
  std::vector<std::byte> q(static_cast<std::size_t>(rows * row_bytes));
  for (std::int64_t r = 0; r < rows; ++r) kernels::quantize_row(x.data(), cols, kernels::DType::Q4, q.data() + r * row_bytes);
  const double s = time_per_call(
      [&] {
        tbb::parallel_for(std::int64_t{0}, (rows + 63) / 64, [&](std::int64_t p) {
          thread_local std::vector<float> scratch;
          const std::int64_t n = std::min<std::int64_t>(64, rows - p * 64);
          scratch.resize(static_cast<std::size_t>(n * cols));
          kernels::convert_rows(q.data() + p * 64 * row_bytes, kernels::DType::Q4, scratch.data(), kernels::DType::F32,
                                n, cols);
        });
      },
      plan.min_seconds);
  const double rate = static_cast<double>(q.size()) / s;
  progress("dequantize q4 " + mib(static_cast<std::int64_t>(q.size())), gbps(rate));
  return rate;
}

// cpu <-> gpu: repeated passes over `bytes` (memcpy on the CPU backend).
double memory_rate(off::CopyEngine& engine, int lane, void* dst, off::Tier dst_tier, const void* src,
                   off::Tier src_tier, std::int64_t bytes, double min_seconds) {
  auto place = [](off::Tier t, const void* base) {
    return [t, base](std::int64_t o) {
      void* p = const_cast<std::byte*>(static_cast<const std::byte*>(base) + o);
      return t == off::Tier::Gpu ? off::Place::gpu(p) : off::Place::cpu(p);
    };
  };
  lane_pass(engine, lane, bytes, place(dst_tier, dst), place(src_tier, src));  // warm-up
  // The fastest of at least three passes (the others measure the neighbours).
  double best = std::numeric_limits<double>::infinity(), seconds = 0;
  for (int passes = 0; passes < 3 || seconds < min_seconds; ++passes) {
    const double t = lane_pass(engine, lane, bytes, place(dst_tier, dst), place(src_tier, src));
    best = std::min(best, t);
    seconds += t;
  }
  return static_cast<double>(bytes) / best;
}

// How much of a cpu->gpu copy hides behind compute: a lane copies while prefill GEMMs run,
// and each gets a share of its speed alone (1 each where a copy engine moves the bytes, 1 in
// all where they take turns on the same cores). Returns the overlap, share sum - 1, in [0, 1].
double copy_overlap(Backend& be, const Plan& plan, off::CopyEngine& engine, int lane, double copy_rate) {
  const std::int64_t n = plan.gemm_n, k = plan.gemm_k, m = plan.prefill_m.front();
  std::vector<std::uint16_t> wh(static_cast<std::size_t>(n * k));
  std::vector<float> wf(wh.size());
  fill(wf.data(), n * k, 1);
  kernels::convert_from_f32(wf.data(), kernels::DType::F16, wh.data(), wh.size());
  DeviceBuffer w(be, wh.size() * sizeof(std::uint16_t));
  be.copy_to_device(w.data(), wh.data(), w.bytes());
  DeviceBuffer x = device_floats(be, m * k, 2);
  DeviceBuffer y(be, static_cast<std::size_t>(m * n) * sizeof(float));
  kernels::GemmArgs a;
  a.x = x.as<float>();
  a.m = m;
  a.w = {w.data(), kernels::DType::F16, n, k};
  a.y = y.as<float>();
  auto gemm = [&] {
    be.gemm(a);
    be.synchronize();
  };
  const double gemm_alone = time_per_call(gemm, plan.min_seconds);

  off::HostBuffer host(static_cast<std::size_t>(plan.memory_bytes), &be);
  DeviceBuffer dev(be, static_cast<std::size_t>(plan.memory_bytes));
  std::memset(host.data(), 0x5a, host.bytes());
  std::atomic<bool> stop{false};
  std::atomic<std::int64_t> copied{0};
  // Small chunks one after another, counted as each lands, for a window long enough that
  // the one in flight at its end does not matter.
  constexpr std::int64_t kSmallChunk = 8 * kMiB;
  std::thread copier([&] {
    for (std::int64_t o = 0; !stop; o = (o + kSmallChunk) % plan.memory_bytes) {
      engine.copy(lane, off::Place::gpu(dev.as<std::byte>() + o), off::Place::cpu(host.as<std::byte>() + o),
                  kSmallChunk, {"calibrate", ""})
          .wait();
      copied += kSmallChunk;
    }
  });
  int calls = 0;
  const auto t0 = Clock::now();
  double elapsed = 0;
  do {
    gemm();
    ++calls;
    elapsed = seconds_since(t0);
  } while (elapsed < std::max(plan.min_seconds, 0.3));
  const double copy_seconds = static_cast<double>(copied.load()) / copy_rate;
  stop = true;
  copier.join();
  const double gemm_share = calls * gemm_alone / elapsed, copy_share = copy_seconds / elapsed;
  const double overlap = std::clamp(gemm_share + copy_share - 1, 0.0, 1.0);
  progress("cpu->gpu copies beside GEMMs",
           fmt::format("GEMM at {:.0f}% and copies at {:.0f}% of their speed alone: overlap {:.2f}", 100 * gemm_share,
                       100 * copy_share, overlap));
  return overlap;
}

// Seconds per small disk request beyond its bytes, with the engine's KV layout: per (sequence,
// kv head) a run of `capacity` slots, one request each for K and V of 8 sequences, all issued
// together as a cache lane does. Writes of one slot (a decode step), of a head's prompt rows
// (prefill: neighbouring requests share partial blocks), and reads of the prompt rows.
struct DiskRequests {
  double read = 0, write = 0, rows_write = 0;
};
DiskRequests disk_requests(off::Tiers& tiers, const Plan& plan, off::Extent e, std::byte* host, double read_rate,
                           double write_rate) {
  const std::int64_t slot = kernels::kv_slot_bytes(plan.cache_dtype, plan.head_dim);
  const std::int64_t prompt = 128, head_bytes = (prompt + 8) * slot;
  const std::int64_t requests = std::min<std::int64_t>(2 * 8 * plan.kv_heads, e.bytes / head_bytes);
  off::Staging staging(&tiers.backend());
  auto per_request = [&](std::int64_t offset, std::int64_t bytes, bool write, double rate) {
    std::vector<off::CopyPiece> pieces;
    for (std::int64_t r = 0; r < requests; ++r) {
      const off::Place d = off::Place::disk(e, r * head_bytes + offset), c = off::Place::cpu(host + r * head_bytes + offset);
      pieces.push_back(write ? off::CopyPiece{d, c, bytes} : off::CopyPiece{c, d, bytes});
    }
    const double t = time_per_call([&] { off::copy_pieces_now(tiers, pieces, staging); }, 0.1);
    return std::max(0.0, t / static_cast<double>(requests) - static_cast<double>(bytes) / rate);
  };
  DiskRequests r;
  r.rows_write = per_request(0, prompt * slot, true, write_rate);
  r.write = per_request(prompt * slot, slot, true, write_rate);
  r.read = per_request(0, (prompt + 1) * slot, false, read_rate);
  progress(fmt::format("disk requests, {} at once, {}-byte slots", requests, slot),
           fmt::format("read {:.0f} us, write of a slot {:.0f} us, of a head's rows {:.0f} us beyond bandwidth",
                       r.read * 1e6, r.write * 1e6, r.rows_write * 1e6));
  return r;
}

std::int64_t free_bytes_at(const std::string& dir) {
  struct statvfs st {};
  if (::statvfs(dir.c_str(), &st) != 0)
    throw std::runtime_error("cannot read the free space of " + dir + ": " + std::strerror(errno));
  return static_cast<std::int64_t>(st.f_bavail) * static_cast<std::int64_t>(st.f_frsize);
}

// Physical memory, or the container's memory limit when that is lower (cgroup v2).
std::int64_t host_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) throw std::runtime_error("cannot read the physical memory size (sysconf)");
  std::int64_t bytes = static_cast<std::int64_t>(pages) * page;
  std::ifstream limit("/sys/fs/cgroup/memory.max");
  std::int64_t cg = 0;
  if (limit >> cg && cg > 0) bytes = std::min(bytes, cg);
  return bytes;
}

std::string host_name() {
  std::array<char, 256> buf{};
  if (::gethostname(buf.data(), buf.size() - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf.data();
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  std::array<char, 32> buf{};
  std::strftime(buf.data(), buf.size(), "%Y-%m-%d %H:%M UTC", &tm);
  return buf.data();
}

// GEMMs at the model's width, attention at its heads, the KV in its float dtype.
void shape_for(Plan& plan, const engine::ModelConfig& cfg) {
  plan.gemm_n = plan.gemm_k = cfg.hidden;
  plan.heads = cfg.n_heads;
  plan.kv_heads = cfg.n_kv_heads;
  plan.head_dim = cfg.head_dim;
  plan.cache_dtype = cfg.dtype;
  plan.weight_dtype = cfg.dtype;
}

// The shapes to measure at: the model's (--model) or the defaults.
Plan plan_of(const CalibrateOptions& o) {
  Plan plan = make_plan(o.quick);
  if (!o.model.empty()) shape_for(plan, job::model_config_of(o.model));
  return plan;
}

// The compute dtype --compute-dtype auto gives a job of that many rows per GPU batch on `be`.
engine::GemmDtypeAt auto_compute_dtype(kernels::Backend& be, const Plan& plan) {
  return [&plan, bf16 = engine::bf16_speed(be, plan.weight_dtype)](std::int64_t rows) {
    return engine::job_compute_dtype("auto", plan.weight_dtype, bf16, rows).dtype;
  };
}

// Compute rates, each GEMM in the compute dtype `compute_at` gives (the model's matrices'
// dtype, f16 without --model). FlexGen fits GEMM and attention matmul rates separately for
// prefill (compute-bound) and decode (memory-bound); the same split is measured here.
void measure_compute(kernels::Backend& be, const Plan& plan, const CalibrateOptions& o,
                     const engine::GemmDtypeAt& compute_at, policy::HardwareProfile& hw) {
  const bool on_cpu = be.kind() == kernels::DeviceKind::Cpu;
  hw.gpu_gemm_prefill = round_sig(gemm_rate(be, plan, plan.prefill_m, "prefill", compute_at));
  hw.gpu_gemm_decode = round_sig(gemm_rate(be, plan, plan.decode_m, "decode", compute_at));
  // The rate by rows, which the cost model reads at each policy's batch (efficiency grows with
  // rows). A GPU's rate climbs until thousands of rows (its calls are launch- and read-bound
  // before), so there the curves reach a large prefill's rows; a CPU's levels off by a few hundred.
  const std::int64_t curve_rows = on_cpu ? (o.quick ? 256 : 4096) : 16384;
  for (std::int64_t m = 1; m <= curve_rows; m *= 4) {
    const double r = gemm_rate(be, plan, {m}, "curve", compute_at);
    hw.gemm_by_rows.emplace_back(m, round_sig(r));
  }
  if (!o.model.empty()) {
    // The model's own decoder layer and head as the engine runs them (what a step pays
    // around its GEMMs), in the compute dtype a run would choose.
    const engine::ModelConfig cfg = job::model_config_of(o.model);
    const TimeCall time_call = [&](const std::function<void()>& fn) { return time_per_call(fn, plan.min_seconds / 2); };
    const UnitCurves units =
        measure_unit_curves(be, cfg, on_cpu ? (o.quick ? 64 : 1024) : curve_rows,
                            on_cpu ? std::int64_t{1} << 30 : be.memory_capacity() / 8, time_call, progress);
    for (const auto& [rows, rate] : units.layer_by_rows) hw.layer_by_rows.emplace_back(rows, round_sig(rate));
    for (const auto& [rows, rate] : units.head_by_rows) hw.head_by_rows.emplace_back(rows, round_sig(rate));
    hw.host_row = host_seconds_per_row(be, cfg, time_call);
    progress("host work per sequence and step (continuous batching)", fmt::format("{:.3g} us", hw.host_row * 1e6));
  }
  hw.gpu_attn_prefill = round_sig(attention_prefill_rate(be, plan, compute_at));
  // Decode attention by cached tokens; the constant is the rate at the longest.
  hw.gpu_attn_decode_by_len = attention_decode_curve(be, plan);
  hw.gpu_attn_decode = hw.gpu_attn_decode_by_len.back().second;
  hw.gpu_attn_decode_read_share = attention_read_share(be, plan);
}

// The cpu-side rates (attention over a cpu-homed cache with cpu_cache_compute) at decode
// shapes: on the CPU backend the "gpu" is this CPU, so they are the same measurements.
void measure_cpu_side(kernels::Backend& be, const Plan& plan, policy::HardwareProfile& hw) {
  if (be.kind() == kernels::DeviceKind::Cpu) {
    hw.cpu_gemm = hw.gpu_gemm_decode;
    hw.cpu_attn_decode_by_len = hw.gpu_attn_decode_by_len;
    hw.cpu_attn_decode = hw.gpu_attn_decode;
    hw.cpu_attn_decode_read_share = hw.gpu_attn_decode_read_share;
    // What compressed weights and KV cost the CPU to expand (a GPU hides it behind PCIe).
    hw.dequant = round_sig(dequant_rate(plan));
    // A GEMM over few rows reads its whole weight matrix from memory, once per GPU batch.
    hw.gpu_memory = round_sig(engine::weight_read_rate(be));
    progress("weight read, one-row GEMM over 64 MiB of f16", gbps(hw.gpu_memory));
    return;
  }
  auto cpu = kernels::make_cpu_backend();
  hw.cpu_gemm = round_sig(gemm_rate(*cpu, plan, plan.decode_m, "cpu decode", auto_compute_dtype(*cpu, plan)));
  hw.cpu_attn_decode_by_len = attention_decode_curve(*cpu, plan);
  hw.cpu_attn_decode = hw.cpu_attn_decode_by_len.back().second;
  hw.cpu_attn_decode_read_share = attention_read_share(*cpu, plan);
}

// cpu <-> gpu. On the CPU backend the gpu tier is host memory and these are memcpy.
void measure_host_device(kernels::Backend& be, const Plan& plan, off::CopyEngine& engine, int lane,
                         policy::HardwareProfile& hw) {
  off::HostBuffer host(static_cast<std::size_t>(plan.memory_bytes), &be);
  DeviceBuffer dev(be, static_cast<std::size_t>(plan.memory_bytes));
  std::memset(host.data(), 0x5a, host.bytes());
  const double c2g = memory_rate(engine, lane, dev.data(), off::Tier::Gpu, host.data(), off::Tier::Cpu,
                                 plan.memory_bytes, plan.min_seconds);
  progress("cpu->gpu " + mib(plan.memory_bytes), gbps(c2g));
  const double g2c = memory_rate(engine, lane, host.data(), off::Tier::Cpu, dev.data(), off::Tier::Gpu,
                                 plan.memory_bytes, plan.min_seconds);
  progress("gpu->cpu " + mib(plan.memory_bytes), gbps(g2c));
  hw.cpu_to_gpu = round_sig(c2g);
  hw.gpu_to_cpu = round_sig(g2c);
  hw.copy_overlap = std::round(copy_overlap(be, plan, engine, lane, c2g) * 100) / 100;
}

// The disk tier's rates through `extent` of it, filled from `host`: written first (fresh blocks,
// as the engine offloads), then the fastest of three passes each way.
void measure_disk_passes(off::Tiers& tiers, const Plan& plan, off::CopyEngine& engine, int lane, off::Extent extent,
                         off::HostBuffer& host, policy::HardwareProfile& hw) {
  off::DiskStore& disk = tiers.disk();
  const std::string how =
      disk.uses_direct_io() ? "" : " (buffered: the filesystem refuses O_DIRECT, reads may hit the page cache)";
  auto at_disk = [extent](std::int64_t offset) { return off::Place::disk(extent, offset); };
  auto at_host = [&host](std::int64_t offset) { return off::Place::cpu(host.as<std::byte>() + offset); };
  double write = lane_pass(engine, lane, plan.disk_bytes, at_disk, at_host), read = 1e300;
  for (int pass = 0; pass < 3; ++pass) {
    read = std::min(read, lane_pass(engine, lane, plan.disk_bytes, at_host, at_disk));
    if (pass < 2) write = std::min(write, lane_pass(engine, lane, plan.disk_bytes, at_disk, at_host));
  }
  const double c2d = static_cast<double>(plan.disk_bytes) / write, d2c = static_cast<double>(plan.disk_bytes) / read;
  progress("cpu->disk " + mib(plan.disk_bytes), gbps(c2d) + how);
  progress("disk->cpu " + mib(plan.disk_bytes), gbps(d2c) + how);
  hw.cpu_to_disk = round_sig(c2d);
  hw.disk_to_cpu = round_sig(d2c);
  const DiskRequests r = disk_requests(tiers, plan, extent, host.as<std::byte>(), d2c, c2d);
  hw.disk_read_request = r.read;
  hw.disk_write_request = r.write;
  hw.disk_rows_write_request = r.rows_write;
}

// disk <-> cpu through the disk store (O_DIRECT where the filesystem allows it), one pass
// each way over a fresh extent.
void measure_disk(kernels::Backend& be, off::Tiers& tiers, const Plan& plan, off::CopyEngine& engine, int lane,
                  policy::HardwareProfile& hw) {
  off::DiskStore& disk = tiers.disk();
  hw.disk_mem = free_bytes_at(disk.dir());
  if (hw.disk_mem < 2 * plan.disk_bytes)
    throw std::runtime_error("offload directory " + disk.dir() + " has only " + off::format_bytes(hw.disk_mem) +
                             " free; calibrate writes " + off::format_bytes(plan.disk_bytes) +
                             "; use --offload-dir on a larger disk");
  off::HostBuffer host(static_cast<std::size_t>(plan.disk_bytes), &be);
  std::uint32_t s = 12345;
  for (std::size_t i = 0; i < host.bytes() / 4; ++i) {
    s = s * 1664525u + 1013904223u;
    host.as<std::uint32_t>()[i] = s;
  }
  const off::Extent e = disk.allocate(plan.disk_bytes, "calibrate");
  try {
    measure_disk_passes(tiers, plan, engine, lane, e, host, hw);
  } catch (...) {
    disk.free(e);
    throw;
  }
  disk.free(e);
}

// Capacities. On the CPU backend the gpu tier is host memory too, so both are the RAM.
void measure_capacities(kernels::Backend& be, const std::string& disk_dir, policy::HardwareProfile& hw) {
  const bool on_cpu = be.kind() == kernels::DeviceKind::Cpu;
  hw.cpu_mem = host_memory_bytes();
  hw.gpu_mem = on_cpu ? hw.cpu_mem : be.memory_capacity();
  hw.gpu_is_host_memory = on_cpu;
  progress("memory", on_cpu ? off::format_bytes(hw.cpu_mem) + " (physical RAM; on the cpu backend the gpu tier is host memory)"
                            : "gpu " + off::format_bytes(hw.gpu_mem) + ", cpu " + off::format_bytes(hw.cpu_mem));
  progress("disk", off::format_bytes(hw.disk_mem) + " free under " + disk_dir);
}

// Where the profile came from: the machine, the run, the compute dtype of each curve point.
std::string profile_source(const CalibrateOptions& o, kernels::Backend& be, const Plan& plan, unsigned threads,
                           const engine::GemmDtypeAt& compute_at, const policy::HardwareProfile& hw) {
  std::string computes;  // e.g. "1 f32, 4 bf16"
  for (const auto& [rows, rate] : hw.gemm_by_rows)
    computes += fmt::format("{}{} {}", computes.empty() ? "" : ", ", rows, kernels::dtype_name(compute_at(rows)));
  return fmt::format("measured by flexh2o calibrate{} on {}, {}: {} backend, {} hardware threads; GEMMs of {} "
                     "weights in the compute dtype --compute-dtype auto gives each row count ({}){}",
                     o.quick ? " --quick" : "", host_name(), utc_now(), be.name(), threads,
                     kernels::dtype_name(plan.weight_dtype), computes,
                     hw.gpu_is_host_memory ? "; the gpu tier is host memory (gpu_mem = cpu_mem = RAM) and cpu rates "
                                             "equal the gpu decode rates"
                                           : "");
}

}  // namespace

policy::HardwareProfile calibrate(const CalibrateOptions& o) {
  const Plan plan = plan_of(o);
  auto be = kernels::make_backend(o.backend);
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  fmt::print(stderr, "calibrate: {} backend, {} hardware threads{}\n", be->name(), threads, o.quick ? ", --quick" : "");

  off::TierOptions to;
  to.offload_dir = o.offload_dir;
  off::Tiers tiers(*be, to);
  const std::string disk_dir = tiers.disk().dir();  // opened now, so a bad offload directory fails at once
  off::CopyEngine engine(tiers);
  const int lane = engine.add_lane("calibrate");

  policy::HardwareProfile hw;
  hw.name = o.name.empty() ? host_name() + "-" + o.backend : o.name;
  const engine::GemmDtypeAt compute_at = auto_compute_dtype(*be, plan);
  measure_compute(*be, plan, o, compute_at, hw);
  measure_cpu_side(*be, plan, hw);
  measure_host_device(*be, plan, engine, lane, hw);
  measure_disk(*be, tiers, plan, engine, lane, hw);
  measure_capacities(*be, disk_dir, hw);
  hw.source = profile_source(o, *be, plan, threads, compute_at, hw);
  return hw;
}

double seconds_per_call(const std::function<void()>& fn, double min_seconds) { return time_per_call(fn, min_seconds); }

namespace {

// calibrate --quick's plan at `cfg`'s shape, each point timed over `seconds`.
Plan quick_plan_of(const engine::ModelConfig& cfg, double seconds) {
  Plan plan = make_plan(true);
  shape_for(plan, cfg);
  plan.min_seconds = seconds;
  return plan;
}

}  // namespace

policy::RateCurve decode_attention_curve(kernels::Backend& be, const engine::ModelConfig& cfg,
                                         std::vector<std::int64_t> lens, double seconds) {
  Plan plan = quick_plan_of(cfg, seconds);
  plan.attn_decode_lens = std::move(lens);
  const Silence quiet;
  return attention_decode_curve(be, plan);
}

double decode_attention_read_share(kernels::Backend& be, const engine::ModelConfig& cfg, double seconds) {
  const Silence quiet;
  return attention_read_share(be, quick_plan_of(cfg, seconds));
}

}  // namespace flexh2o::job
