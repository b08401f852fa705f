// Staged KV copies on the CPU backend: the KV cache homed on the cpu tier is copied into the
// device ring before each layer's attention and its new slots back after it.
//   (1) pieces: one layer-batch of OPT-175B's KV (gbs 32, 96 kv heads, 256-byte fp16 slots),
//       its valid slots loaded and one new slot per head stored, as the scheduler laid the
//       copies out before (a piece per sequence, kv head and K/V) and now (one 2-D piece per
//       sequence and K/V, kv_stage_pieces); building the pieces and copying them, interleaved.
//   (2) scheduler: decode tok/s with the KV staged from the cpu tier vs homed on the gpu tier
//       (weights resident in both, so the KV copies are what differs); variants interleaved.
// Min and median over the repetitions.
// Usage: bench_kv_staging [reps] [model] [prompt_len] [gen_len]
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "bench/timing.h"
#include "engine/runtime/block_executor.h"
#include "engine/serving/generate.h"
#include "engine/runtime/kv_staging.h"
#include "engine/loaders/model_source.h"
#include "engine/serving/prompts.h"
#include "offload/tiered_tensor.h"

using namespace flexh2o;

namespace {

struct Stats {
  double min = 0, median = 0;
};
Stats stats_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v.front(), v[v.size() / 2]};
}

// One loaded scheduler per variant, so the repetitions measure generation, not loading.
struct SchedulerRun {
  SchedulerRun(const engine::ModelSource& m, const policy::Policy& p)
      : be(kernels::make_cpu_backend()), tiers(*be, {}), sched(*be, tiers, m.config, *m.weights, p) {}
  std::unique_ptr<kernels::Backend> be;
  offload::Tiers tiers;
  engine::BlockExecutor sched;
};

// (1): the pieces of one layer-batch, old layout vs new, both directions.
void bench_pieces(int reps, std::int64_t prompt_len) {
  const std::int64_t gbs = 32, heads = 96, slot = 256, capacity = prompt_len + 32;
  const std::int64_t head = capacity * slot, row = heads * head;
  auto be = kernels::make_cpu_backend();
  offload::Tiers tiers(*be, {});
  offload::TieredTensor k(tiers, "K", kernels::DType::F16, gbs, heads * capacity * 128, {0, 1, 0}, row);
  offload::TieredTensor v(tiers, "V", kernels::DType::F16, gbs, heads * capacity * 128, {0, 1, 0}, row);
  kernels::DeviceBuffer kd(*be, static_cast<std::size_t>(gbs * row)), vd(*be, static_cast<std::size_t>(gbs * row));
  offload::Staging staging;
  std::vector<std::int64_t> lens;  // this step's lengths: a ragged batch
  for (std::int64_t s = 0; s < gbs; ++s) lens.push_back(prompt_len + 1 + s % 16);
  // load: slots [0, len - 1) of every head; store: slot len - 1.
  auto ranges = [&](bool store) {
    std::vector<engine::KvByteRange> r;
    for (std::int64_t n : lens) r.push_back(store ? engine::KvByteRange{(n - 1) * slot, n * slot} : engine::KvByteRange{0, (n - 1) * slot});
    return r;
  };
  auto old_layout = [&](bool store) {
    std::vector<offload::CopyPiece> pieces;
    const auto r = ranges(store);
    for (std::int64_t s = 0; s < gbs; ++s)
      for (std::int64_t h = 0; h < heads; ++h)
        for (auto [t, base] : {std::pair{&k, kd.as<std::byte>()}, std::pair{&v, vd.as<std::byte>()}}) {
          const auto& x = r[static_cast<std::size_t>(s)];
          auto p = t->pieces(s, s + 1, offload::Place::gpu(base + s * row), store, h * head + x.from, h * head + x.to);
          pieces.insert(pieces.end(), p.begin(), p.end());
        }
    return pieces;
  };
  auto new_layout = [&](bool store) {
    return engine::kv_stage_pieces(k, v, heads, 0, ranges(store), kd.as<std::byte>(), vd.as<std::byte>(), store);
  };
  fmt::print("(1) pieces of one layer-batch: gbs {}, {} kv heads, {}-byte slots, lens {}..{}, KV on the cpu tier, {} reps\n\n",
             gbs, heads, slot, lens.front(), lens.back(), reps);
  fmt::print("| copy | layout | pieces | bytes | ms min | ms median |\n|---|---|---|---|---|---|\n");
  for (bool store : {false, true}) {
    std::vector<std::vector<double>> ms(2);
    std::size_t count[2] = {0, 0};
    std::int64_t bytes[2] = {0, 0};
    for (int rep = -1; rep < reps; ++rep)  // rep -1: warm-up (page faults)
      for (int layout = 0; layout < 2; ++layout) {
        const double t = bench::seconds_of([&] {
          const auto pieces = layout == 0 ? old_layout(store) : new_layout(store);
          offload::copy_pieces_now(tiers, pieces, staging);
          count[layout] = pieces.size();
          bytes[layout] = 0;
          for (const auto& p : pieces) bytes[layout] += p.total();
        });
        if (rep >= 0) ms[static_cast<std::size_t>(layout)].push_back(1e3 * t);
      }
    for (int layout = 0; layout < 2; ++layout) {
      const Stats st = stats_of(ms[static_cast<std::size_t>(layout)]);
      fmt::print("| {} | {} | {} | {} | {:.3f} | {:.3f} |\n", store ? "store (1 slot per head)" : "load (valid slots)",
                 layout == 0 ? "per (seq, head, K/V)" : "2-D per (seq, K/V)", count[layout],
                 offload::format_bytes(bytes[layout]), st.min, st.median);
    }
    fmt::print("| {} | old / new (medians) | | | {:.2f}x | |\n", store ? "store" : "load",
               stats_of(ms[0]).median / stats_of(ms[1]).median);
  }
  fmt::print("\n");
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 5;
  engine::ModelOptions mo;
  mo.model = argc > 2 ? argv[2] : "opt-125m";
  mo.dummy = true;
  mo.dtype = kernels::DType::F16;
  const std::int64_t prompt_len = argc > 3 ? std::atoll(argv[3]) : 128;
  const std::int64_t gen_len = argc > 4 ? std::atoll(argv[4]) : 16;
  bench_pieces(std::max(reps, 1) * 4, prompt_len);
  auto m = engine::open_model(mo);
  m.config.stop_ids.clear();
  const std::int64_t gbs = 32;
  std::vector<std::pair<std::string, std::array<double, 6>>> variants = {
      {"KV on the gpu tier", {100, 0, 100, 0, 100, 0}}, {"KV on the cpu tier (staged)", {100, 0, 0, 100, 100, 0}}};
  std::vector<std::unique_ptr<SchedulerRun>> runs;
  for (const auto& [name, percent] : variants) {
    policy::Policy p;
    p.gpu_batch_size = gbs;
    p.num_gpu_batches = 1;
    p.set_percent(percent);
    p.overlap = true;
    runs.push_back(std::make_unique<SchedulerRun>(m, p));
  }
  engine::GenerationRequest req;
  req.sequences = engine::sequences_of(engine::synthetic_prompts(gbs, prompt_len, m.config.vocab_size));
  req.max_new_tokens = gen_len;
  for (auto& r : runs) serving::generate(r->sched, req);  // warm-up
  std::vector<std::vector<double>> tok_s(runs.size());
  for (int rep = 0; rep < reps; ++rep)
    for (std::size_t i = 0; i < runs.size(); ++i)
      tok_s[i].push_back(serving::generate(runs[i]->sched, req).decode_throughput());
  fmt::print("(2) scheduler, {} (f16 dummy), gbs {} x K 1, prompt {} + gen {}, weights on the gpu tier, {} reps\n\n",
             m.config.name, gbs, prompt_len, gen_len, reps);
  fmt::print("| variant | decode tok/s min | median |\n|---|---|---|\n");
  std::vector<Stats> st;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    st.push_back(stats_of(tok_s[i]));
    fmt::print("| {} | {:.1f} | {:.1f} |\n", variants[i].first, st[i].min, st[i].median);
  }
  fmt::print("\nstaged / resident decode tok/s (medians): {:.2f}x\n", st[1].median / st[0].median);
  return 0;
}
