// Smaller KV on the CPU backend with the KV cache homed on the cpu tier and that tier's budget
// fixed (--cpu-mem): the largest batch that fits and its throughput for the full fp32 cache,
// an eviction policy, the 4-bit compressed cache, and both, at prompt 512 + gen 32 (FlexGen's
// setting). The largest batch is found by asking the scheduler: one more sequence must be
// refused by the cpu budget.
// Several policies (comma list) are measured side by side, `repeats` times interleaved, and
// each row reports the median and the spread (min-max) of its tok/s, so that policies compare
// at the same batch on a noisy machine; `caches` picks the fp32 rows, the 4-bit rows or both.
// Usage: bench_kv_eviction [model] [cpu_mem] [policies] [repeats] [caches]
//        (defaults: opt-125m 128MiB h2o:0.2 1 both; caches: plain, 4bit or both)
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "engine/runtime/block_executor.h"
#include "engine/serving/generate.h"
#include "engine/loaders/model_source.h"
#include "engine/serving/prompts.h"

using namespace flexh2o;

namespace {

constexpr std::int64_t kPrompt = 512, kGen = 32;

engine::GenerationRequest request(const engine::ModelConfig& cfg, std::int64_t batch, std::int64_t gen) {
  engine::GenerationRequest req;
  req.sequences = engine::sequences_of(engine::synthetic_prompts(batch, kPrompt, cfg.vocab_size));
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
    engine::BlockExecutor sched(*be, tiers, c, *m.weights, p);
    try {
      serving::generate(sched, request(c, r.batch + 1, kGen));
      throw std::runtime_error("batch " + std::to_string(r.batch + 1) + " fit the cpu budget unexpectedly");
    } catch (const offload::BudgetExceeded&) {
    }
  }
  offload::Tiers tiers(*be, to);
  p.gpu_batch_size = r.batch;
  engine::BlockExecutor sched(*be, tiers, c, *m.weights, p);
  const auto res = serving::generate(sched, request(c, r.batch, kGen));
  r.decode_tok_s = res.decode_throughput();
  r.total_tok_s = res.total_throughput();
  r.cpu_peak = tiers.budget(offload::Tier::Cpu).peak();
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  engine::ModelOptions mo;
  mo.model = argc > 1 ? argv[1] : "opt-125m";
  mo.dummy = true;
  mo.dtype = kernels::DType::F16;
  const std::int64_t cpu_mem = offload::parse_bytes(argc > 2 ? argv[2] : "128MiB");
  std::vector<std::string> policies = {"full"};
  for (const auto& spec : policy::parse_kv_specs(argc > 3 ? argv[3] : "h2o:0.2"))
    if (!spec.is_full()) policies.push_back(spec.text);
  const int repeats = argc > 4 ? std::max(1, std::stoi(argv[4])) : 1;
  const std::string caches = argc > 5 ? argv[5] : "both";
  if (caches != "plain" && caches != "4bit" && caches != "both")
    throw std::invalid_argument("caches must be plain, 4bit or both, got '" + caches + "'");
  auto m = engine::open_model(mo);
  m.config.stop_ids.clear();
  struct Row {
    std::string name, policy;
    bool compress = false;
    std::vector<Result> runs;
  };
  std::vector<Row> rows;
  for (const bool compress : {false, true}) {
    if ((compress && caches == "plain") || (!compress && caches == "4bit")) continue;
    for (const std::string& policy : policies) rows.push_back({policy + (compress ? " + 4-bit cache" : ""), policy, compress, {}});
  }
  for (int rep = 0; rep < repeats; ++rep)
    for (auto& row : rows) row.runs.push_back(measure(m, row.policy, row.compress, cpu_mem));
  fmt::print("model {} (f16 dummy), prompt {} + gen {}, KV on the cpu tier, --cpu-mem {}, {} run(s) per row "
             "(median, min-max)\n\n",
             m.config.name, kPrompt, kGen, offload::format_bytes(cpu_mem), repeats);
  fmt::print("| kv | largest batch | cpu peak | decode tok/s | total tok/s | batch vs full | total tok/s vs full |\n"
             "|---|---|---|---|---|---|---|\n");
  auto stat = [](const Row& row, double Result::*field) {
    std::vector<double> v;
    for (const auto& r : row.runs) v.push_back(r.*field);
    return std::tuple{median(v), *std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end())};
  };
  // Ratios against the full cache of the same storage (fp32 or 4-bit rows).
  for (const auto& row : rows) {
    const Row& full = *std::find_if(rows.begin(), rows.end(),
                                    [&](const Row& r) { return r.policy == "full" && r.compress == row.compress; });
    const Result& r = row.runs.front();
    const auto [dec, dec_lo, dec_hi] = stat(row, &Result::decode_tok_s);
    const auto [tot, tot_lo, tot_hi] = stat(row, &Result::total_tok_s);
    fmt::print("| {} | {} | {} | {:.1f} ({:.1f}-{:.1f}) | {:.1f} ({:.1f}-{:.1f}) | {:.2f}x | {:.2f}x |\n", row.name, r.batch,
               offload::format_bytes(r.cpu_peak), dec, dec_lo, dec_hi, tot, tot_lo, tot_hi,
               static_cast<double>(r.batch) / static_cast<double>(full.runs.front().batch),
               tot / std::get<0>(stat(full, &Result::total_tok_s)));
  }
  return 0;
}
