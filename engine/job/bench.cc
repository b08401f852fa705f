#include "engine/job/bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/runtime/block_executor.h"
#include "engine/serving/generate.h"
#include "engine/runtime/machine_profile.h"
#include "engine/model/model_shape.h"
#include "engine/loaders/model_source.h"
#include "engine/serving/prompts.h"
#include "offload/budget.h"
#include "policy/cost_model.h"
#include "policy/policy_text.h"

namespace flexh2o::job {

namespace {

// The largest gbs in [1, max] whose policy fits the profile's memory (the cost model's sizes).
std::int64_t largest_batch(const std::string& system, const policy::ModelShape& m, const policy::HardwareProfile& hw,
                           const policy::Workload& w, policy::Policy p, const policy::PlanOptions& o, std::int64_t max) {
  auto fits = [&](std::int64_t gbs) {
    p.gpu_batch_size = gbs;
    return policy::estimate(m, hw, w, p, o).has_value();
  };
  if (!fits(1)) {
    p.gpu_batch_size = 1;
    policy::estimate_or_throw(m, hw, w, p, o, "system '" + system + "' with one sequence");
  }
  std::int64_t lo = 1, hi = 2;
  while (hi <= max && fits(hi)) {
    lo = hi;
    hi *= 2;
  }
  hi = std::min(hi, max + 1);
  while (hi - lo > 1) {
    const std::int64_t mid = (lo + hi) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

std::vector<std::string> split_list(const std::string& s, char sep = ',') {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, sep);)
    if (!item.empty()) out.push_back(item);
  return out;
}

// When the weights do not fit the cpu tier next to one sequence: Accelerate's offload folder
// takes the smallest share to disk that fits; ZeRO-Inference (`whole`) offloads them all to NVMe.
void spill_weights_to_disk(const policy::ModelShape& m, const policy::HardwareProfile& hw, const policy::Workload& w,
                           policy::Policy& p, const policy::PlanOptions& o, bool whole) {
  auto fits = [&](double cpu) {
    policy::Policy q = p;
    q.gpu_batch_size = 1;
    q.weights = {0, cpu, 1 - cpu};
    return policy::estimate(m, hw, w, q, o).has_value();
  };
  if (fits(1)) return;
  if (whole) {
    p.weights = {0, 0, 1};
    return;
  }
  double lo = 0, hi = 1;  // fits(lo), !fits(hi)
  if (!fits(lo)) return;  // largest_batch reports what does not fit
  for (int i = 0; i < 30; ++i) (fits((lo + hi) / 2) ? lo : hi) = (lo + hi) / 2;
  p.weights = {0, lo, 1 - lo};
}

constexpr const char* kSystems = " (accelerate, zero, flexgen, flexgen+h2o, flexgen+4bit, flexgen+4bit+h2o)";

// The policy each system would run with on these limits.
policy::Policy policy_for(const std::string& system, const policy::ModelShape& m, const policy::HardwareProfile& hw,
                          const policy::Workload& w, std::int64_t max_batch, bool allow_ccc) {
  policy::Policy p;
  policy::PlanOptions o;
  o.allow_cpu_cache_compute = allow_ccc;
  if (system == "accelerate") {
    // Layer-by-layer weight streaming for one small batch, KV on the GPU, no overlap; weights
    // that do not fit CPU memory are offloaded to disk (device_map with an offload folder).
    p.set_percent({0, 100, 100, 0, 100, 0});
    p.overlap = false;
    spill_weights_to_disk(m, hw, w, p, o, false);
    p.gpu_batch_size = largest_batch(system, m, hw, w, p, o, max_batch);
  } else if (system == "zero") {
    // ZeRO-Inference as the FlexGen paper ran it: weights streamed per layer from CPU memory
    // (or all from NVMe when they do not fit), KV and activations on the GPU, one batch, no
    // compute/IO overlap.
    p.set_percent({0, 100, 100, 0, 100, 0});
    p.overlap = false;
    spill_weights_to_disk(m, hw, w, p, o, true);
    p.gpu_batch_size = largest_batch(system, m, hw, w, p, o, max_batch);
  } else if (system.starts_with("flexgen")) {
    // flexgen[+h2o][+4bit]: the planner's policy, for the smaller KV (h2o:0.2) and/or 4-bit
    // weights and KV (planner re-run for each).
    const std::string mods = system.substr(7);
    if (!mods.empty() && mods[0] != '+') throw std::invalid_argument("unknown system '" + system + "'" + kSystems);
    for (const std::string& mod : split_list(mods, '+')) {
      if (mod == "h2o") {
        o.kv = policy::parse_kv_spec("h2o:0.2");
      } else if (mod == "4bit") {
        o.compress_weight = o.compress_cache = true;
      } else {
        throw std::invalid_argument("unknown system '" + system + "'" + kSystems);
      }
    }
    o.max_block = max_batch;
    p = policy::plan(m, hw, w, o).policy;
  } else {
    throw std::invalid_argument("unknown system '" + system + "'" + kSystems);
  }
  return p;
}

}  // namespace

BenchRuns bench_systems(const BenchOptions& o) {
  engine::ModelOptions mo;
  mo.model = o.model;
  // Throughput does not depend on the weights' values: a config without weights runs random ones.
  mo.dummy = o.dummy || !engine::names_weights(o.model);
  mo.dtype = kernels::parse_dtype(o.dtype);
  auto m = engine::open_model(mo);
  m.config.stop_ids.clear();  // every sequence generates gen_len tokens
  policy::HardwareProfile hw = engine::hardware_profile(o.hardware);
  hw.gpu_mem = offload::parse_bytes(o.gpu_mem);
  if (!o.cpu_mem.empty()) hw.cpu_mem = offload::parse_bytes(o.cpu_mem);
  if (!o.disk_mem.empty()) hw.disk_mem = offload::parse_bytes(o.disk_mem);
  const policy::ModelShape shape = engine::model_shape(m.config);
  const policy::Workload w{o.prompt_len, o.gen_len};

  auto be = kernels::make_backend(o.backend);
  // Attention over a cpu-homed KV in place needs a CPU backend beside a device one (not yet).
  const bool allow_ccc = be->kind() == kernels::DeviceKind::Cpu;
  BenchRuns out{.model = m.config.name, .backend = be->name(), .hw = hw, .runs = {}};
  for (const std::string& system : split_list(o.systems)) {
    SystemRun r;
    r.system = system;
    r.policy = policy_for(system, shape, hw, w, o.max_batch, allow_ccc);
    fmt::print(stderr, "bench: {}: gpu batch {} x {}, percent [{}], overlap {}{}\n", system, r.policy.gpu_batch_size,
               r.policy.num_gpu_batches, policy::percent_text(r.policy, 0), r.policy.overlap,
               r.policy.compress_weight ? ", 4-bit weights and KV" : "");
    offload::TierOptions to;
    to.gpu_bytes = hw.gpu_mem;
    to.cpu_bytes = hw.cpu_mem;
    to.disk_bytes = hw.disk_mem;
    offload::Tiers tiers(*be, to);
    m.config.compute_dtype =
        engine::job_compute_dtype(o.compute_dtype, m.config.dtype, engine::bf16_speed(*be, r.policy.weight_dtype(m.config.dtype)),
                                  r.policy.gpu_batch_size)
            .dtype;
    engine::BlockExecutor sched(*be, tiers, m.config, *m.weights, r.policy);
    engine::GenerationRequest req;
    req.sequences =
        engine::sequences_of(engine::synthetic_prompts(r.policy.block_size(), o.prompt_len, m.config.vocab_size));
    req.max_new_tokens = o.gen_len;
    r.result = serving::generate(sched, req);
    r.prefill_tput = r.result.prefill_throughput();
    r.decode_tput = r.result.decode_throughput();
    r.total_tput = r.result.total_throughput();
    for (int t = 0; t < 3; ++t) r.peak[static_cast<std::size_t>(t)] = tiers.budget(static_cast<offload::Tier>(t)).peak();
    out.runs.push_back(std::move(r));
  }

  return out;
}

}  // namespace flexh2o::job
