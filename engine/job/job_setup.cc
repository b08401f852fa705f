#include "engine/job/job_setup.h"

#include <fmt/format.h>

#include <algorithm>
#include <random>

#include <unistd.h>

#include "engine/chat/chat_template.h"
#include "engine/job/model_rates.h"
#include "engine/loaders/template_source.h"
#include "kernels/option_error.h"
#include "engine/runtime/machine_profile.h"
#include "engine/runtime/generator.h"
#include "engine/runtime/prefix_match.h"
#include "engine/serving/engine.h"
#include "engine/model/model_shape.h"
#include "policy/policy_text.h"

namespace flexh2o::job {

using namespace flexh2o::engine;
namespace chat = flexh2o::engine::chat;
using kernels::Option;
using kernels::OptionError;

namespace {

// A policy with the schedule options (overlap, sep_layer, pin_weight, MoE loading, prefix pool)
// applied.
policy::Policy with_schedule_options(const JobOptions& o, policy::Policy p) {
  if (o.overlap) p.overlap = *o.overlap != 0;
  if (o.sep_layer) p.sep_layer = *o.sep_layer != 0;
  if (o.pin_weight) p.pin_weight = *o.pin_weight != 0;
  if (!o.expert_loading.empty()) p.expert_loading = o.expert_loading;
  if (o.expert_slots) p.expert_slots = *o.expert_slots;
  if (!o.prefix_pool.empty()) p.prefix_pool = o.prefix_pool;
  return p;
}

policy::Policy make_policy(const JobOptions& o) {
  policy::Policy p = o.policy_file.empty() ? policy::Policy{} : policy::load_policy_file(o.policy_file);
  if (!o.percent.empty()) {
    try {
      p.set_percent({o.percent[0], o.percent[1], o.percent[2], o.percent[3], o.percent[4], o.percent[5]});
    } catch (const std::invalid_argument& e) {
      throw OptionError{Option::Placement, std::string(": ") + e.what()};
    }
  }
  if (o.resident_embeddings) p.resident_embeddings = *o.resident_embeddings != 0;
  // Without a policy file or a GPU batch size, all prompts of the batch form one GPU batch.
  if (o.gpu_batch_size) p.gpu_batch_size = *o.gpu_batch_size;
  else if (o.policy_file.empty()) p.gpu_batch_size = o.batch.value_or(1);
  if (o.num_gpu_batches) p.num_gpu_batches = *o.num_gpu_batches;
  if (o.cpu_cache_compute) p.cpu_cache_compute = true;
  if (!o.kv.empty()) p.kv = o.kv;
  p = with_schedule_options(o, std::move(p));
  o.compress.apply(p);
  p.validate(o.policy_file.empty() ? "policy flags" : o.policy_file);
  return p;
}

}  // namespace

std::int64_t tier_capacity(const std::string& text, Option option) {
  if (text.empty()) return offload::Budget::kUnlimited;
  try {
    return offload::parse_bytes(text);
  } catch (const std::invalid_argument& e) {
    throw OptionError{option, std::string(": ") + e.what()};
  }
}

JobSetup open_setup(const JobOptions& o) {
  JobSetup s;
  ModelOptions mo;
  mo.model = o.model;
  mo.tokenizer = o.tokenizer;
  mo.dummy = o.dummy;
  mo.seed = o.seed;
  if (!o.dtype.empty()) mo.dtype = kernels::parse_dtype(o.dtype);
  // Throughput first: a batch job without placement flags runs the planner's policy (as large a
  // batch as fits this machine or the hardware profile, and the tier capacities); so does policy auto.
  s.placed = (!o.policy_file.empty() && o.policy_file != "auto") || !o.percent.empty() || o.gpu_batch_size ||
             o.num_gpu_batches || o.resident_embeddings;
  const bool batch_job = !o.prompts_file.empty() || !o.request_lines.empty() || o.batch.value_or(1) > 1;
  s.auto_policy = o.policy_file == "auto" || (!s.placed && batch_job);
  if (!s.auto_policy) s.policy = make_policy(o);
  s.tiers.gpu_bytes = tier_capacity(o.gpu_mem, Option::GpuMem);
  s.tiers.cpu_bytes = tier_capacity(o.cpu_mem, Option::CpuMem);
  s.tiers.disk_bytes = tier_capacity(o.disk_mem, Option::DiskMem);
  s.tiers.offload_dir = o.offload_dir;
  s.model = open_model(mo);
  s.backend = kernels::make_backend(o.backend);
  if (o.ignore_eos) s.model.config.stop_ids.clear();
  if (s.model.tokenizer)
    s.constraints = std::make_unique<serving::JobConstraints>(*s.model.tokenizer, s.model.config,
                                                          s.backend->kind() != kernels::DeviceKind::Cpu);
  s.gen_len = o.gen_len.value_or(o.model.empty() ? kEmbeddedGenLen : policy::kDefaultGenLen);
  return s;
}

void settle_compute_dtype(const JobOptions& o, JobSetup& s) {
  // The matrices as the run stores them (compress_weight: q4/q8, which the CPU multiplies by int8).
  const kernels::DType matrices = s.policy.weight_dtype(s.model.config.dtype);
  const ComputeChoice c =
      job_compute_dtype(o.compute_dtype, s.model.config.dtype, bf16_speed(*s.backend, matrices), s.policy.gpu_batch_size);
  s.model.config.compute_dtype = c.dtype;
  s.compute_why = c.why;
}

policy::HardwareProfile planning_profile(const JobOptions& o, const JobSetup& s) {
  policy::HardwareProfile hw =
      o.hardware.empty()
          ? this_machine_profile(*s.backend, o.offload_dir,
                                 [&, bf16 = bf16_speed(*s.backend, s.model.config.dtype)](std::int64_t rows) {
                                   // a job of `rows` per GPU batch multiplies every step in this dtype
                                   return job_compute_dtype(o.compute_dtype, s.model.config.dtype, bf16, rows).dtype;
                                 })
          : hardware_profile(o.hardware);
  if (o.hardware.empty()) add_model_rates(*s.backend, s.model.config, hw);
  for (auto [bytes, field] : {std::pair{s.tiers.gpu_bytes, &hw.gpu_mem}, std::pair{s.tiers.cpu_bytes, &hw.cpu_mem},
                              std::pair{s.tiers.disk_bytes, &hw.disk_mem}})
    if (bytes != offload::Budget::kUnlimited) *field = bytes;
  return hw;
}

policy::PlanOptions plan_options(const JobOptions& o, const JobSetup& s, std::int64_t max_block) {
  policy::PlanOptions po;
  po.kv = policy::parse_kv_spec(o.kv.empty() ? "full" : o.kv);
  o.compress.apply(po);
  // Attention over a cpu-homed KV in place needs a CPU backend beside a device one (not yet).
  po.allow_cpu_cache_compute = s.backend->kind() == kernels::DeviceKind::Cpu;
  po.max_block = std::max<std::int64_t>(max_block, 1);  // no block larger than the job
  return po;
}

namespace {

policy::Workload workload_of(const JobOptions& o, std::vector<policy::RequestLength> lengths) {
  if (o.batching == "continuous" && o.pipeline <= 1)
    return policy::continuous_workload(std::move(lengths), o.prefill_budget.value_or(0));
  policy::Workload w;
  w.prompt_len = w.gen_len = 0;
  for (const auto& r : lengths) {
    w.prompt_len = std::max(w.prompt_len, r.prompt);
    w.gen_len = std::max(w.gen_len, r.gen);
  }
  return w;
}

// Prefix sharing as the step scheduler applies it to this job (docs/prefix-sharing.md): under
// continuous batching with prefix sharing on, every request of a prefix family but the first in
// the job takes the family's prefix (RequestLength::shared); with `on`, the families may be held
// once (Workload::held; the planner decides where a block would).
void add_shared_prefixes(const JobOptions& o, const engine::ModelConfig& cfg, std::span<const serving::Request> requests,
                         policy::Workload& w) {
  const bool evicting = !o.kv.empty() && o.kv != "full";
  if (!w.continuous || o.prefix_sharing == "off" || !engine::prefix_sharing_off_reason(cfg, evicting).empty()) return;
  std::vector<std::span<const std::int32_t>> prompts;
  for (const serving::Request& r : requests) prompts.emplace_back(r.prompt);
  const engine::PrefixFamilies f = engine::prefix_families(prompts, engine::GenerationRequest{}.min_shared_prefix);
  engine::add_families(f, w.requests);
  if (o.prefix_sharing == "on") w.held = engine::held_prefixes(f, w.requests);
}

}  // namespace

policy::Workload job_workload(const JobOptions& o, const engine::ModelConfig& cfg,
                              std::span<const serving::Request> requests, std::int64_t gen_len) {
  std::vector<policy::RequestLength> lengths;
  for (std::size_t i = 0; i < requests.size(); ++i)
    lengths.push_back({.prompt = static_cast<std::int64_t>(requests[i].prompt.size()),
                       .gen = requests[i].max_tokens,
                       .shares_prompt = o.share_prefill == 1 && serving::shares_prompt_of_previous(requests, i)});
  if (lengths.empty()) lengths.push_back({0, gen_len});  // as longest_limit: the new tokens limit for none
  policy::Workload w = workload_of(o, std::move(lengths));
  if (!requests.empty()) add_shared_prefixes(o, cfg, requests, w);
  return w;
}

policy::Workload synthetic_workload(const JobOptions& o, std::int64_t count, std::int64_t gen_len) {
  return workload_of(o, std::vector<policy::RequestLength>(static_cast<std::size_t>(std::max<std::int64_t>(count, 1)),
                                                           {o.prompt_len, gen_len}));
}

void check_placement_fits(const JobOptions& o, JobSetup& s, std::span<const serving::Request> requests,
                          const policy::HardwareProfile& hw) {
  const auto prompts = static_cast<std::int64_t>(requests.size());
  try {
    s.predicted = policy::estimate_or_throw(engine::model_shape(s.model.config), hw,
                                            job_workload(o, s.model.config, requests, s.gen_len), s.policy,
                                            plan_options(o, s, prompts), "");
  } catch (const OptionError& e) {
    // "the placement given (--percent, ...) does not fit ...", the options named by the front end.
    std::vector<kernels::OptionText::Piece> text =
        s.placed ? std::vector<kernels::OptionText::Piece>{"the placement given (", Option::Placement, ", ",
                                                           Option::Policy, " or ", Option::GpuBatchSize, ")"}
                 : std::vector<kernels::OptionText::Piece>{"the default placement (", Option::Policy,
                                                           " auto lets the planner fit the run)"};
    text.insert(text.end(), e.pieces().begin(), e.pieces().end());
    throw OptionError(std::move(text));
  }
  // The tiers' budgets default to what was checked, so what the estimate missed is still a
  // budget error naming the tier, not the kernel's kill.
  for (auto [bytes, capacity] : {std::pair{&s.tiers.gpu_bytes, hw.gpu_mem}, std::pair{&s.tiers.cpu_bytes, hw.cpu_mem}})
    if (*bytes == offload::Budget::kUnlimited) *bytes = capacity;
}

void adopt_plan(const JobOptions& o, JobSetup& s, const policy::Policy& planned, const policy::HardwareProfile& hw) {
  s.policy = with_schedule_options(o, planned);
  s.tiers.gpu_bytes = hw.gpu_mem;
  s.tiers.cpu_bytes = hw.cpu_mem;
  s.tiers.disk_bytes = hw.disk_mem;
}

std::string planned_line(const policy::HardwareProfile& hw, const policy::Estimate& e) {
  const auto& pol = e.policy;
  return fmt::format("planned for {}: gpu batch {} x {}, percent [{}]{}, cpu_cache_compute {}{}; predicted {} {:.2f} tok/s",
                     hw.name, pol.gpu_batch_size, pol.num_gpu_batches, policy::percent_text(pol, 1),
                     pol.resident_embeddings ? " (embeddings and head resident)" : "", pol.cpu_cache_compute,
                     pol.prefix_pool == "auto" ? "" : ", prefix pool on " + pol.prefix_pool,
                     e.continuous ? "generated" : "total", e.total_throughput);
}

std::string uncalibrated_note(const JobOptions& o) {
  const std::string model = o.model.empty() ? "" : " --model " + o.model;
  return fmt::format(
      "  (partly calibrated: a built-in profile's rates, scaled by GEMMs measured now, and this model's layers "
      "and head as measured on this machine by its first run (kept in {}); to measure the rest too (attention, "
      "copies, disk) run `flexh2o calibrate{} --out this-machine.yaml` once and pass --hardware this-machine.yaml)",
      model_rates_dir(), model);
}

namespace {

// The prompts of the job: the prompts file, else the prompt text or synthetic ones, `count` of
// them; tokenized.
std::vector<PromptItem> gather_prompts(const JobOptions& o, const ModelSource& m, std::int64_t count) {
  std::vector<PromptItem> items;
  if (!o.prompts_file.empty()) {
    items = read_prompts_jsonl(o.prompts_file);
    if (items.empty()) throw std::runtime_error(o.prompts_file + ": no prompts in the file");
  } else if (!o.prompt.empty() || m.tokenizer) {
    // A text prompt (empty: start from BOS), repeated to fill one batch.
    for (std::int64_t i = 0; i < count; ++i) items.push_back({std::to_string(i), o.prompt, {}});
  } else {
    // No tokenizer and no prompts: random token prompts, as FlexGen's synthetic benchmarks use.
    std::mt19937_64 rng(o.seed);
    std::uniform_int_distribution<std::int32_t> tok(0, static_cast<std::int32_t>(m.config.vocab_size - 1));
    for (std::int64_t i = 0; i < count; ++i) {
      PromptItem it{std::to_string(i), std::nullopt, {}};
      for (std::int64_t t = 0; t < o.prompt_len; ++t) it.tokens.push_back(tok(rng));
      items.push_back(std::move(it));
    }
  }
  tokenize_prompts(items, m.tokenizer.get(), m.config.bos_id, m.config.name, m.config.position_limit());
  return items;
}

// The model's chat template over a request's messages; a model without one gives a renderer
// that throws why (the error of every chat line, while completions still run).
std::function<std::string(const nlohmann::ordered_json&)> chat_renderer(const JobOptions& o, const FrontEnd& front) {
  try {
    const auto src = std::make_shared<const chat::TemplateSource>(chat::load_model_template(o.model, "", false));
    const auto tmpl = std::make_shared<const chat::ChatTemplate>(src->text, src->name);
    return [src, tmpl](const nlohmann::ordered_json& messages) {
      chat::ChatInputs in;
      in.messages = messages;
      in.add_generation_prompt = true;
      in.bos_token = src->bos_token;
      in.eos_token = src->eos_token;
      return tmpl->render(in);
    };
  } catch (const std::exception& e) {
    const auto* t = dynamic_cast<const kernels::OptionText*>(&e);
    return [why = t ? t->text(front.option_name) : std::string(e.what())](const nlohmann::ordered_json&) -> std::string {
      throw std::invalid_argument("no chat template: " + why);
    };
  }
}

// A prompts line's constraint, compiled once here so that one not supported fails the job
// before the model loads, naming the line's id and field.
grammar::Constraint checked_constraint(const JobSetup& s, const PromptItem& item) {
  const std::string where = "prompt " + item.id_json + ": " + item.constraint->field;
  if (!s.constraints)
    throw std::invalid_argument(where + ": model '" + s.model.config.name +
                                "' has no tokenizer, which structured output needs (the tokens' bytes)");
  try {
    s.constraints->get(item.constraint->constraint, item.max_tokens.value_or(s.gen_len));
  } catch (const std::exception& e) {
    throw std::invalid_argument(where + ": " + e.what());
  }
  return item.constraint->constraint;
}

}  // namespace

serving::OpenAiPromptContext openai_prompt_context(const JobOptions& o, const JobSetup& s, const FrontEnd& front) {
  return {.config = &s.model.config,
          .tok = s.model.tokenizer.get(),
          .render_chat = chat_renderer(o, front),
          .gen_len = s.gen_len,
          .default_seed = o.seed,
          .constraints = s.constraints.get()};
}

std::vector<serving::Request> make_requests(const JobOptions& o, const JobSetup& s, std::int64_t count) {
  const std::vector<PromptItem> items = gather_prompts(o, s.model, count);
  std::vector<serving::Request> requests;
  for (std::size_t i = 0; i < items.size(); ++i) {
    requests.push_back({items[i].id_json, items[i].text, items[i].tokens, items[i].max_tokens.value_or(s.gen_len),
                        {.temperature = o.temperature, .top_p = o.top_p, .seed = o.seed}, i});
    if (items[i].constraint) requests.back().constraint = checked_constraint(s, items[i]);
  }
  return requests;
}

namespace {

// Continuous batching's prefill budget: the one given, else the one the policy run was planned
// or checked with (policy::default_prefill_budget for its GPU batch and the profile).
std::int64_t prefill_budget_of(const JobOptions& o, const JobSetup& s) {
  if (o.prefill_budget) return *o.prefill_budget;
  return s.predicted && s.predicted->prefill_budget > 0 ? s.predicted->prefill_budget : policy::kHostPrefillBudget;
}

// Whether request r's text so far holds one of its stop strings; null without a tokenizer.
serving::StopStringSeen stop_string_watch(const JobSetup& s) {
  if (!s.model.tokenizer) return {};
  // The text of the new tokens after the prompt's last token (enough context for the
  // tokenizer's spacing).
  return [&tok = *s.model.tokenizer](const serving::Request& r, std::span<const std::int32_t> generated) {
    return serving::stop_position(serving::Continuation(tok, std::span(r.prompt).last(1)).text(generated), r.stop) !=
           std::string::npos;
  };
}

}  // namespace

// Pipeline stages copy shared prefixes: each places its own memory, and a pool held on some
// stages but not on others (BlockExecutor::place_with_pool) would admit requests apart.
serving::EngineOptions engine_options(const JobOptions& o, const JobSetup& s) {
  return {.policy = s.policy,
          .tiers = s.tiers,
          .continuous = o.batching == "continuous",
          .prefill_budget = prefill_budget_of(o, s),
          .share_prefill = o.share_prefill == 1,
          .share_prefixes = o.prefix_sharing != "off",
          .hold_prefixes = o.prefix_sharing == "on" && o.pipeline <= 1,
          .cuda_graphs = o.cuda_graphs == "on",
          .constraints = s.constraints.get(),
          .trace = !o.metrics_file.empty() || !o.trace_file.empty(),
          .stage = std::nullopt,
          .stop_string_seen = stop_string_watch(s),
          .results_in = o.out_file};
}

std::optional<serving::ProgressOptions> progress_options(const JobOptions& o, const JobSetup& s) {
  if (o.quiet) return std::nullopt;
  return serving::ProgressOptions{
      .planned_tokens_per_second = s.predicted && s.predicted->continuous ? s.predicted->total_throughput : 0,
      .planned_context_seconds = s.predicted && s.predicted->continuous ? s.predicted->context_token_seconds : 0,
      .terminal = ::isatty(STDERR_FILENO) == 1};
}

}  // namespace flexh2o::job
