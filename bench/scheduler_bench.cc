// The zig-zag block scheduler on the CPU backend with a dummy model whose weights are several
// times the "gpu" budget and partly on disk:
//   (a) overlap on vs off, same policy (ratio of decode throughput);
//   (b) overlap efficiency = measured decode time / max(compute time, transfer time), from the
//       trace (1.0 = perfect overlap; transfers are summed per lane, the busiest lane counts);
//   (c) effective batch 1 vs the larger gbs x K blocks (ratio of decode throughput).
// Variants run interleaved and report medians. Usage: bench_scheduler [model] [gen_len] [reps]
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <map>

#include "bench/timing.h"
#include "engine/runtime/block_executor.h"
#include "engine/serving/generate.h"
#include "engine/loaders/model_source.h"
#include "engine/serving/prompts.h"

using namespace flexh2o;

namespace {

struct Variant {
  std::string name;
  policy::Policy policy;
};

struct Measured {
  double decode_tok_s = 0, efficiency = 0, compute_s = 0, transfer_s = 0;
  std::int64_t gpu_peak = 0;
};

// One loaded scheduler per variant, so the repetitions measure generation, not loading.
struct Runner {
  Runner(const engine::ModelSource& m, const Variant& v)
      : model(m), variant(v), be(kernels::make_cpu_backend()), tiers(*be, {}),
        sched(*be, tiers, m.config, *m.weights, v.policy, &trace) {}
  const engine::ModelSource& model;
  const Variant& variant;
  std::unique_ptr<kernels::Backend> be;
  offload::Tiers tiers;
  offload::Trace trace;
  engine::BlockExecutor sched;
};

Measured run_once(Runner& run, std::int64_t prompt_len, std::int64_t gen_len) {
  const auto& cfg = run.model.config;
  const auto& policy = run.variant.policy;
  engine::GenerationRequest req;
  req.sequences = engine::sequences_of(engine::synthetic_prompts(policy.block_size(), prompt_len, cfg.vocab_size));
  req.max_new_tokens = gen_len;
  const double start = run.trace.now();
  const auto r = serving::generate(run.sched, req);
  // Only this run's decode spans count for (b): prefill is compute-bound and runs once.
  const double decode_start = start + r.prefill_seconds;
  std::map<std::string, double> busy;
  double compute = 0;
  for (const auto& s : run.trace.spans()) {
    if (s.t0 < decode_start) continue;
    (s.track == "compute" ? compute : busy[s.track]) += s.t1 - s.t0;
  }
  double transfer = 0;
  for (const auto& [track, t] : busy) transfer = std::max(transfer, t);
  Measured out;
  out.decode_tok_s = r.decode_throughput();
  out.compute_s = compute;
  out.transfer_s = transfer;
  out.efficiency = r.decode_seconds / std::max(compute, transfer);
  out.gpu_peak = run.tiers.budget(offload::Tier::Gpu).peak();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  engine::ModelOptions mo;
  mo.model = argc > 1 ? argv[1] : "opt-1.3b";
  mo.dummy = true;
  mo.dtype = kernels::DType::F16;
  const std::int64_t gen_len = argc > 2 ? std::atoll(argv[2]) : 8;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 3;
  auto m = engine::open_model(mo);
  m.config.stop_ids.clear();
  const std::int64_t prompt_len = 8;

  // Weights: none resident on the gpu tier (only the two staging slots), 70% cpu, 30% disk;
  // KV and activations on the gpu tier.
  auto make = [](std::string name, std::int64_t gbs, std::int64_t k, bool overlap) {
    Variant v{std::move(name), {}};
    v.policy.gpu_batch_size = gbs;
    v.policy.num_gpu_batches = k;
    v.policy.set_percent({0, 70, 100, 0, 100, 0});
    v.policy.overlap = overlap;
    return v;
  };
  const std::vector<Variant> variants = {make("gbs 8 x K 4, overlap", 8, 4, true), make("gbs 8 x K 4, no overlap", 8, 4, false),
                                         make("gbs 1 x K 1, overlap", 1, 1, true), make("gbs 32 x K 1, overlap", 32, 1, true)};
  std::vector<std::unique_ptr<Runner>> runners;
  for (const auto& v : variants) runners.push_back(std::make_unique<Runner>(m, v));
  std::vector<std::vector<Measured>> all(variants.size());
  for (auto& r : runners) run_once(*r, prompt_len, 2);  // warm-up: page faults, thread pools
  for (int r = 0; r < reps; ++r)
    for (std::size_t i = 0; i < variants.size(); ++i) all[i].push_back(run_once(*runners[i], prompt_len, gen_len));
  std::vector<Measured> med;
  for (auto& runs : all) {
    std::sort(runs.begin(), runs.end(), [](auto& a, auto& b) { return a.decode_tok_s < b.decode_tok_s; });
    med.push_back(runs[runs.size() / 2]);
  }
  std::int64_t weight_bytes = 0;
  for (const auto& w : engine::weight_specs(m.config))
    weight_bytes += w.rows * kernels::row_bytes(w.dtype(m.config), w.cols);
  fmt::print("model {} (f16 dummy, {} of weights), prompt {} + gen {}, weights 0/70/30 gpu/cpu/disk, {} reps (median)\n\n",
             m.config.name, offload::format_bytes(weight_bytes), prompt_len, gen_len, reps);
  fmt::print("| variant | decode tok/s | compute s | busiest copy lane s | efficiency | gpu peak |\n|---|---|---|---|---|---|\n");
  for (std::size_t i = 0; i < variants.size(); ++i)
    fmt::print("| {} | {:.1f} | {:.3f} | {:.3f} | {:.2f} | {} |\n", variants[i].name, med[i].decode_tok_s, med[i].compute_s,
               med[i].transfer_s, med[i].efficiency, offload::format_bytes(med[i].gpu_peak));
  fmt::print("\nweights / gpu peak of the gbs 8 x K 4 run: {:.1f}x\n", static_cast<double>(weight_bytes) / med[0].gpu_peak);
  fmt::print("(a) overlap on / off: {:.2f}x\n", med[0].decode_tok_s / med[1].decode_tok_s);
  fmt::print("(b) overlap efficiency (decode time / max(compute, transfer)), overlap on: {:.2f} (target <= 1.15)\n",
             med[0].efficiency);
  const double best = std::max(med[0].decode_tok_s, med[3].decode_tok_s);
  fmt::print("(c) best block / effective batch 1: {:.2f}x\n", best / med[2].decode_tok_s);
  return 0;
}
