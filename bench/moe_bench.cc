// Expert offloading on a dummy Mixtral-shaped model scaled to this machine (Mixtral-8x7B's
// layout: 8 experts, top-2, SwiGLU experts 3.5x hidden, GQA 4:1; hidden 512, 8 layers, fp16),
// weights mostly on disk, CPU backend: decode tok/s and expert weight bytes moved per decode
// token with only the routed experts loaded (staging slots sized from the block, for every
// expert, and for top_k = 2 experts, where batches routed to more run in chunks), with every
// expert loaded, and with the default (auto: routed unless about all experts are expected
// active), at gbs x K = 1x1, 8x1, 32x4, with the staging slots' bytes. Variants run
// interleaved, in a rotating order; min and median over the repetitions.
// Usage: bench_moe [reps] [gen_len] [weight percent on disk]
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "bench/timing.h"
#include "engine/runtime/block_executor.h"
#include "engine/serving/generate.h"
#include "engine/families/model_yaml.h"
#include "engine/loaders/dummy_weights.h"
#include "engine/serving/prompts.h"

using namespace flexh2o;

namespace {

engine::ModelConfig scaled_mixtral() {
  engine::ModelConfig c = engine::builtin_model("mixtral-8x7b");
  c.name = "mixtral-8x7b scaled to hidden 512, 8 layers";
  c.n_layers = 8;
  c.hidden = 512;
  c.ffn = c.moe.expert_ffn = 1792;
  c.n_heads = 8;
  c.n_kv_heads = 2;
  c.head_dim = 64;
  c.vocab_size = 4096;
  c.dtype = kernels::DType::F16;
  c.moe.layers.assign(static_cast<std::size_t>(c.n_layers), true);
  c.stop_ids.clear();  // every sequence decodes the full length
  return c;
}

struct Runner {
  Runner(const engine::ModelConfig& cfg, const engine::WeightSource& src, const policy::Policy& p)
      : be(kernels::make_cpu_backend()),
        tiers(*be, {}),
        sched(*be, tiers, cfg, src, p),
        staging_bytes(tiers.budget(offload::Tier::Gpu).used()) {}
  std::unique_ptr<kernels::Backend> be;
  offload::Tiers tiers;
  engine::BlockExecutor sched;
  std::int64_t staging_bytes;  // no weights on the gpu tier: its two staging slots
  std::vector<double> tok_s, bytes_per_token, experts_per_step;
};

void run_once(Runner& r, const engine::GenerationRequest& req) {
  const auto before = r.sched.expert_loads();
  const auto res = serving::generate(r.sched, req);
  const auto& after = r.sched.expert_loads();
  std::int64_t bytes = 0, experts = 0;  // decode steps only
  for (std::size_t s = 1; s < after.bytes_by_step.size(); ++s) {
    const bool had = s < before.bytes_by_step.size();
    bytes += after.bytes_by_step[s] - (had ? before.bytes_by_step[s] : 0);
    experts += after.experts_by_step[s] - (had ? before.experts_by_step[s] : 0);
  }
  const auto decode_tokens = static_cast<double>(res.generated_tokens - res.sequences);
  r.tok_s.push_back(res.decode_throughput());
  r.bytes_per_token.push_back(static_cast<double>(bytes) / decode_tokens);
  r.experts_per_step.push_back(static_cast<double>(experts) / static_cast<double>(res.decode_steps));
}

double min_of(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 5;
  const std::int64_t gen_len = argc > 2 ? std::atoll(argv[2]) : 8;
  const double disk = argc > 3 ? std::atof(argv[3]) / 100.0 : 0.8;
  const engine::ModelConfig cfg = scaled_mixtral();
  engine::DummyWeights src(cfg, 1);
  const std::int64_t prompt_len = 16;
  fmt::print("{}: weights {:.0f}% cpu / {:.0f}% disk, prompt {}, gen {}, {} reps (min / median)\n\n", cfg.name,
             100 * (1 - disk), 100 * disk, prompt_len, gen_len, reps);
  fmt::print("| gbs x K | loading | expert slots | staging MiB | decode tok/s min | median | expert MiB moved / "
             "decode token min | median | experts fetched / decode step (of {}) |\n|---|---|---|---|---|---|---|---|---|\n",
             cfg.n_layers * cfg.moe.experts);
  struct Variant {
    const char* loading;
    std::int64_t slots;  // 0: sized from the block
  };
  const Variant variants[] = {{"routed", 0}, {"routed", cfg.moe.experts}, {"routed", cfg.moe.top_k}, {"all", 0},
                              {"auto", 0}};
  for (const auto& [gbs, K] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {8, 1}, {32, 4}}) {
    std::vector<std::unique_ptr<Runner>> runners;
    std::vector<std::string> names, slots;
    for (const Variant& v : variants) {
      policy::Policy p;
      p.gpu_batch_size = gbs;
      p.num_gpu_batches = K;
      p.weights = {0, 1 - disk, disk};
      p.expert_loading = v.loading;
      p.expert_slots = v.slots;
      runners.push_back(std::make_unique<Runner>(cfg, src, p));
      names.emplace_back(v.loading);
      const std::int64_t n = p.expert_slot_count(cfg.moe.experts, cfg.moe.top_k);
      slots.push_back(std::to_string(n) + (v.slots == 0 ? " (block)" : ""));
    }
    engine::GenerationRequest req;
    req.sequences = engine::sequences_of(engine::synthetic_prompts(gbs * K, prompt_len, cfg.vocab_size));
    req.max_new_tokens = gen_len;
    for (auto& r : runners) serving::generate(r->sched, req);  // warm-up: thread pools, page faults
    // Each repetition starts with the next variant, so no variant always runs first or last.
    for (int i = 0; i < reps; ++i)
      for (std::size_t j = 0; j < runners.size(); ++j) run_once(*runners[(j + static_cast<std::size_t>(i)) % runners.size()], req);
    for (std::size_t m = 0; m < runners.size(); ++m) {
      const Runner& r = *runners[m];
      fmt::print("| {}x{} | {} | {} | {:.1f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.1f} |\n", gbs, K, names[m], slots[m],
                 static_cast<double>(r.staging_bytes) / (1 << 20), min_of(r.tok_s), bench::median(r.tok_s),
                 min_of(r.bytes_per_token) / (1 << 20), bench::median(r.bytes_per_token) / (1 << 20),
                 bench::median(r.experts_per_step));
    }
    std::fflush(stdout);
  }
  return 0;
}
