#include "engine/job/plan_job.h"

#include <fmt/format.h>

#include <tuple>

#include "engine/job/job_setup.h"
#include "engine/job/model_rates.h"
#include "engine/loaders/model_source.h"
#include "engine/model/model_shape.h"
#include "engine/runtime/machine_profile.h"
#include "engine/runtime/prefix_match.h"
#include "kernels/backend.h"
#include "kernels/option_error.h"
#include "offload/budget.h"
#include "policy/eviction/kv_spec.h"

namespace flexh2o::job {

using kernels::Option;
using kernels::OptionError;

engine::ModelConfig model_config_of(const std::string& model) {
  engine::ModelOptions mo;
  mo.model = model;
  mo.dummy = true;  // only the shape is needed; nothing is read
  return engine::open_model(mo).config;
}

namespace {

// This machine as run plans for it: each row count's GEMMs timed in the dtype run's compute
// dtype auto settles for a job of that many rows per GPU batch, and the model's rates.
policy::HardwareProfile this_machine(const PlanJobOptions& o, const engine::ModelConfig& cfg) {
  const auto be = kernels::make_backend(o.backend);
  const engine::Bf16Speed bf16 = engine::bf16_speed(*be, cfg.dtype);
  policy::HardwareProfile hw = engine::this_machine_profile(*be, o.offload_dir, [&](std::int64_t rows) {
    return engine::job_compute_dtype("auto", cfg.dtype, bf16, rows).dtype;  // a job of `rows` per GPU batch
  });
  add_model_rates(*be, cfg, hw);
  return hw;
}

// The profile to plan with: the one given or this machine, its capacities lowered by those given.
policy::HardwareProfile plan_profile(const PlanJobOptions& o, const engine::ModelConfig& cfg) {
  policy::HardwareProfile hw = o.hardware.empty() ? this_machine(o, cfg) : engine::hardware_profile(o.hardware);
  for (auto [text, field, option] : {std::tuple{&o.gpu_mem, &hw.gpu_mem, Option::GpuMem},
                                     std::tuple{&o.cpu_mem, &hw.cpu_mem, Option::CpuMem},
                                     std::tuple{&o.disk_mem, &hw.disk_mem, Option::DiskMem}})
    if (!text->empty()) *field = tier_capacity(*text, option);
  return hw;
}

void check_mean(const std::optional<double>& mean, std::int64_t most, Option option, Option max_option) {
  if (mean && *mean > static_cast<double>(most))
    throw OptionError{option, fmt::format(" {} is above ", *mean), max_option, fmt::format(" {} (the longest)", most)};
}

// The job plan predicts: the maxima (what must fit) and, under continuous batching, the means.
policy::Workload plan_workload(const PlanJobOptions& o) {
  const bool means = o.mean_prompt_len || o.mean_gen_len;
  if (o.pipeline > 1 && (o.batching == "continuous" || means))
    throw OptionError{Option::Pipeline, " plans every slot at its longest request, as for fixed blocks: ",
                      Option::Batching, " continuous and the means (", Option::MeanPromptLen, ", ", Option::MeanGenLen,
                      ") do not apply"};
  const bool continuous = o.pipeline <= 1 && o.batching.value_or("continuous") == "continuous";
  if (!continuous && means)
    throw OptionError{o.mean_prompt_len ? Option::MeanPromptLen : Option::MeanGenLen,
                      " is for continuous batching: fixed blocks run every sequence to the longest"};
  check_mean(o.mean_prompt_len, o.prompt_len, Option::MeanPromptLen, Option::PromptLen);
  check_mean(o.mean_gen_len, o.gen_len, Option::MeanGenLen, Option::GenLen);
  policy::Workload w{o.prompt_len, o.gen_len};
  w.continuous = continuous;
  w.mean_prompt_len = o.mean_prompt_len.value_or(0);
  w.mean_gen_len = o.mean_gen_len.value_or(0);
  w.prefill_budget = o.prefill_budget.value_or(0);
  return w;
}

// A shared prefix: each request takes its prefix from its family's first (which the steady
// state leaves out), and the families are held once, as run plans a job whose prompts share them.
void add_shared_prefix(const PlanJobOptions& o, const engine::ModelConfig& cfg, policy::Workload& w) {
  if (o.shared_prefix == 0) {
    if (o.prefix_families != 1) throw OptionError{Option::PrefixFamilies, " needs ", Option::SharedPrefix};
    return;
  }
  if (!w.continuous) throw OptionError{Option::SharedPrefix, " is for continuous batching (fixed blocks share none)"};
  const std::string off = engine::prefix_sharing_off_reason(cfg, o.kv != "full");
  if (!off.empty()) throw OptionError{Option::SharedPrefix, ": prefix sharing is off here: " + off};
  const double mean_prompt = w.mean_prompt_len > 0 ? w.mean_prompt_len : static_cast<double>(w.prompt_len);
  if (static_cast<double>(o.shared_prefix) >= mean_prompt)
    throw OptionError{Option::SharedPrefix,
                      fmt::format(" {} must be below the mean prompt ({:.1f} tokens): a prompt computes at least its "
                                  "last token",
                                  o.shared_prefix, mean_prompt)};
  w.mean_shared = static_cast<double>(o.shared_prefix);
  w.held = {.families = o.prefix_families,
            .prefix = o.shared_prefix,
            .rest = w.sequence_capacity() - o.shared_prefix,
            .mean_prefix = static_cast<double>(o.shared_prefix)};
}

// The policy file with the KV policy and compression over it, validated; po.kv set to its KV spec.
policy::Policy given_policy(const PlanJobOptions& o, policy::PlanOptions& po) {
  policy::Policy fixed = policy::load_policy_file(o.policy_file);
  if (o.kv != "full") fixed.kv = o.kv;
  o.compress.apply(fixed);
  fixed.validate(o.policy_file);
  po.kv = policy::parse_kv_spec(fixed.kv);
  return fixed;
}

// A pipeline of `o.pipeline` stages, each on hw: the split, each stage's placement, the throughput.
void plan_pipeline(const PlanJobOptions& o, PlannedJob& p) {
  const policy::ModelShape& shape = p.shape;
  p.workload = policy::Workload{o.prompt_len, o.gen_len};
  p.micro_batches = o.micro_batches.value_or(o.pipeline);
  const std::vector<policy::HardwareProfile> hws(static_cast<std::size_t>(o.pipeline), p.hw);
  if (o.policy_file.empty()) {
    p.pipeline = policy::plan_pipeline(shape, hws, p.workload, p.micro_batches, p.options);
  } else {
    const policy::Policy fixed = given_policy(o, p.options);
    p.pipeline = policy::estimate_pipeline(shape, hws, p.workload, fixed, p.micro_batches, p.options);
  }
}

}  // namespace

PlannedJob plan_job(const PlanJobOptions& o, std::size_t ranked) {
  PlannedJob p{.config = model_config_of(o.model)};
  p.shape = engine::model_shape(p.config);
  p.hw = plan_profile(o, p.config);
  p.options.kv = policy::parse_kv_spec(o.kv);
  o.compress.apply(p.options);
  // As run plans: attention over a cpu-homed KV in place (cpu_cache_compute) runs on the CPU
  // backend only, whose profiles have the gpu tier in host memory.
  p.options.allow_cpu_cache_compute = p.hw.gpu_is_host_memory;
  if (o.batch) p.options.max_block = *o.batch;
  p.workload = plan_workload(o);
  add_shared_prefix(o, p.config, p.workload);
  if (o.pipeline > 1) {
    plan_pipeline(o, p);
    return p;
  }
  if (o.micro_batches) throw OptionError{Option::MicroBatches, " is for pipelines (", Option::Pipeline, " N)"};
  const policy::ModelShape& shape = p.shape;
  if (o.policy_file.empty()) {
    p.ranked = policy::plan_ranked(shape, p.hw, p.workload, p.options, ranked);
    p.estimate = p.ranked.front();
  } else {
    const policy::Policy fixed = given_policy(o, p.options);
    p.estimate = policy::estimate_or_throw(shape, p.hw, p.workload, fixed, p.options, "the policy in " + o.policy_file);
  }
  return p;
}

}  // namespace flexh2o::job
