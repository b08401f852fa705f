// Smaller KV on the CPU backend with the KV cache homed on the cpu tier and that tier's budget
// fixed (--cpu-mem): the largest batch that fits and its throughput for the full fp32 cache,
// an eviction policy, the 4-bit compressed cache, and both, at prompt 512 + gen 32 (FlexGen's
// setting). The largest batch is found by asking the scheduler: one more sequence must be
// refused by the cpu budget.
// Usage: bench_kv_eviction [model] [cpu_mem] [policy]   (defaults: opt-125m 128MiB h2o:0.2)
#include <fmt/format.h>

#include <string>
#include <vector>

#include "engine/block_scheduler.h"
#include "engine/model_source.h"
#include "engine/prompts.h"

using namespace flexh2o;

namespace {

constexpr std::int64_t kPrompt = 512, kGen = 32;

engine::GenerationRequest request(const engine::ModelConfig& cfg, std::int64_t batch, std::int64_t gen) {
  engine::GenerationRequest req;
  req.prompts = engine::synthetic_prompts(batch, kPrompt, cfg.vocab_size);
  req.max_new_tokens = gen;
  return req;
}

struct Result {
  std::int64_t batch = 0;
  double decode_tok_s = 0, total_tok_s = 0;
  std::int64_t cpu_peak = 0;
};

Result measure(const engine::ModelSource& m, const std::string& kv, bool compress, std::int64_t cpu_mem) {
  policy::Policy p;
  p.set_percent({100, 0, 0, 100, 100, 0});  // KV on the cpu tier, the rest on "gpu"
  p.kv = kv;
  p.compress_cache = compress;
  // Bytes of one sequence's KV: the capacity the scheduler gives it, over all layers.
  const auto& c = m.config;
  std::int64_t slots = kPrompt + kGen;
  if (kv != "full") {
    const auto pol = policy::make_kv_policy(policy::parse_kv_spec(kv), c.n_layers);
    slots = 0;
    for (std::int64_t l = 0; l < c.n_layers; ++l)
      slots = std::max(slots, policy::kv_slot_capacity(std::min(pol->budget(l, kPrompt + kGen), kPrompt + kGen)));
  }
  const std::int64_t per_seq = 2 * c.n_layers * c.n_kv_heads * slots * kernels::kv_slot_bytes(p.cache_dtype(c.dtype), c.head_dim);
  Result r;
  r.batch = cpu_mem / per_seq;
  auto be = kernels::make_cpu_backend();
  offload::TierOptions to;
  to.cpu_bytes = cpu_mem;
  // One more sequence must not fit (checked before any compute), else the formula is wrong.
  {
    offload::Tiers tiers(*be, to);
    p.gpu_batch_size = r.batch + 1;
    engine::BlockScheduler sched(*be, tiers, c, *m.weights, p);
    try {
      sched.generate(request(c, r.batch + 1, kGen));
      throw std::runtime_error("batch " + std::to_string(r.batch + 1) + " fit the cpu budget unexpectedly");
    } catch (const offload::BudgetExceeded&) {
    }
  }
  offload::Tiers tiers(*be, to);
  p.gpu_batch_size = r.batch;
  engine::BlockScheduler sched(*be, tiers, c, *m.weights, p);
  const auto res = sched.generate(request(c, r.batch, kGen));
  r.decode_tok_s = res.decode_throughput();
  r.total_tok_s = res.total_throughput();
  r.cpu_peak = tiers.budget(offload::Tier::Cpu).peak();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  engine::ModelOptions mo;
  mo.model = argc > 1 ? argv[1] : "opt-125m";
  mo.dummy = true;
  mo.dtype = kernels::DType::F16;
  const std::int64_t cpu_mem = offload::parse_bytes(argc > 2 ? argv[2] : "128MiB");
  const std::string kv = argc > 3 ? argv[3] : "h2o:0.2";
  auto m = engine::open_model(mo);
  m.config.stop_ids.clear();
  struct Row {
    std::string name;
    Result r;
  };
  std::vector<Row> rows;
  for (const bool compress : {false, true})
    for (const std::string& policy : {std::string("full"), kv})
      rows.push_back({policy + (compress ? " + 4-bit cache" : ""), measure(m, policy, compress, cpu_mem)});
  fmt::print("model {} (f16 dummy), prompt {} + gen {}, KV on the cpu tier, --cpu-mem {}\n\n", m.config.name, kPrompt,
             kGen, offload::format_bytes(cpu_mem));
  fmt::print("| kv | largest batch | cpu peak | decode tok/s | total tok/s | batch vs full | total tok/s vs full |\n"
             "|---|---|---|---|---|---|---|\n");
  const Result& full = rows.front().r;
  for (const auto& [name, r] : rows)
    fmt::print("| {} | {} | {} | {:.1f} | {:.1f} | {:.2f}x | {:.2f}x |\n", name, r.batch,
               offload::format_bytes(r.cpu_peak), r.decode_tok_s, r.total_tok_s,
               static_cast<double>(r.batch) / static_cast<double>(full.batch), r.total_tok_s / full.total_tok_s);
  return 0;
}
