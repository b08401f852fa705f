#include "engine/cli/plan_command.h"

#include <fmt/format.h>

#include "engine/cli/compression_flags.h"
#include "engine/model/weights.h"
#include "offload/budget.h"
#include "offload/text_file.h"
#include "policy/policy_text.h"

namespace flexh2o::cli {

CLI::App* add_plan_command(CLI::App& app, PlanCliOptions& o) {
  auto* plan = app.add_subcommand("plan", "Choose placement and batch sizes with the cost model (dry run, no GPU needed)");
  plan->add_option("--model", o.model, "built-in config name (opt-30b, llama-2-70b, ...), model YAML or checkpoint")->required();
  plan->add_option("--hardware", o.hardware,
                   "hardware profile: a YAML file (from flexh2o calibrate) or a built-in name (t4-gcp, a100-80g, h100-pcie, "
                   "h100-sxm, ci-cpu); default: this machine as run plans for it (its memory within its cgroup, free disk "
                   "under --offload-dir, built-in rates)");
  plan->add_option("--backend", o.backend, "with no --hardware: the backend whose machine to plan for (auto, cpu, cuda)");
  plan->add_option("--offload-dir", o.offload_dir, "with no --hardware: where the disk tier would go (its free space)");
  plan->add_option("--batch", o.batch, "prompts of the job: no block larger (as run plans for its prompts); default: any block")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  plan->add_option("--prompt-len", o.prompt_len, "prompt tokens")->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  plan->add_option("--gen-len", o.gen_len, "new tokens (the largest max_tokens of the job)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  plan->add_option("--batching", o.batching,
                   "as run shares the slots: continuous (default, as run) or fixed blocks (--pipeline: planned as fixed)")
      ->check(CLI::IsMember({"continuous", "fixed"}));
  plan->add_option("--mean-prompt-len", o.mean_prompt_len,
                   "continuous batching: the job's mean prompt tokens (default --prompt-len, the longest)")
      ->check(CLI::Range(1.0, static_cast<double>(std::int64_t{1} << 20)));
  plan->add_option("--mean-gen-len", o.mean_gen_len,
                   "continuous batching: the job's mean new tokens per request (default --gen-len, the largest)")
      ->check(CLI::Range(1.0, static_cast<double>(std::int64_t{1} << 20)));
  plan->add_option("--prefill-budget", o.prefill_budget, "continuous batching: as run --prefill-budget")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  plan->add_option("--shared-prefix", o.shared_prefix,
                   "continuous batching: every prompt starts with a prefix of this many tokens shared by the job "
                   "(instructions, few-shot examples, a system prompt), computed and held once as run does "
                   "(docs/prefix-sharing.md)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  plan->add_option("--prefix-families", o.prefix_families,
                   "with --shared-prefix: how many different such prefixes the job mixes (default 1)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  plan->add_option("--kv", o.kv, "KV eviction policy, e.g. h2o:0.2 (default full)");
  plan->add_option("--gpu-mem", o.gpu_mem, "override the profile's GPU memory");
  plan->add_option("--cpu-mem", o.cpu_mem, "override the profile's CPU memory");
  plan->add_option("--disk-mem", o.disk_mem, "override the profile's disk space");
  plan->add_option("--out", o.out_file, "write the chosen policy as YAML (for flexh2o run --policy)");
  plan->add_flag("--explain", o.explain,
                 "also print sizes, memory per tier and (when searching) the 5 best policies evaluated with their times");
  plan->add_option("--policy", o.policy_file, "predict this policy YAML instead of searching (placement and batch)");
  add_compression_flags(plan, o.compress, "Compression");
  plan->add_option("--pipeline", o.pipeline,
                   "predict pipeline parallelism over N ranks, each with this hardware (as run --pipeline N under mpirun)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 16));
  plan->add_option("--micro-batches", o.micro_batches, "blocks in flight in the pipeline (default: N)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 16));
  return plan;
}

namespace {

// "prompt 512 + gen 32" or, continuous, "prompt 512 (mean 69) + gen 501 (mean 247), continuous batching".
std::string workload_text(const policy::Workload& w) {
  if (!w.continuous) return fmt::format("prompt {} + gen {}", w.prompt_len, w.gen_len);
  auto mean = [](double m, std::int64_t most) { return m > 0 ? m : static_cast<double>(most); };
  const std::string shared =
      w.mean_shared == 0 ? ""
      : w.held.families == 0
          ? fmt::format(", {:.0f} tokens of each from a shared prefix", w.mean_shared)
          : fmt::format(", {:.0f} tokens of each from {} shared prefix{} held once", w.mean_shared, w.held.families,
                        w.held.families == 1 ? "" : "es");
  return fmt::format("prompt {} (mean {:.1f}) + gen {} (mean {:.1f}){}, continuous batching", w.prompt_len,
                     mean(w.mean_prompt_len, w.prompt_len), w.gen_len, mean(w.mean_gen_len, w.gen_len), shared);
}

std::string items_text(const std::vector<std::pair<std::string, std::int64_t>>& items) {
  std::string out;
  for (const auto& [name, bytes] : items) out += (out.empty() ? "" : ", ") + name + " " + offload::format_bytes(bytes);
  return out.empty() ? "nothing" : out;
}

// plan --pipeline N: the split, each stage's placement and the pipeline's throughput.
void print_pipeline(const PlanCliOptions& o, const job::PlannedJob& p) {
  const policy::PipelineEstimate& e = *p.pipeline;
  const engine::ModelConfig& cfg = p.config;
  const policy::HardwareProfile& hw = p.hw;
  const std::int64_t M = p.micro_batches;
  const auto& p0 = e.stages.front().policy;
  fmt::print("model: {} on {} x {} ({}), prompt {} + gen {}, kv {}, weights {}, cache {}\n", cfg.name, o.pipeline,
             hw.name, hw.source, o.prompt_len, o.gen_len, p0.kv, kernels::dtype_name(p0.weight_dtype(cfg.dtype)),
             kernels::dtype_name(p0.cache_dtype(cfg.dtype)));
  fmt::print("pipeline: {} stages, {} micro-batches of gpu batch {} x {} (block {})\n", o.pipeline, M,
             p0.gpu_batch_size, p0.num_gpu_batches, p0.block_size());
  for (std::size_t s = 0; s < e.stages.size(); ++s) {
    const auto& sl = e.slices[s];
    const auto& st = e.stages[s];
    fmt::print("stage {}: decoder layers {}-{}{}{}: percent [{}], "
               "cpu_cache_compute {}, memory gpu {} | cpu {} | disk {}; per block prefill {:.3f} s, decode step {:.4f} s\n",
               s, sl.first_layer, sl.first_layer + sl.layers - 1, sl.input ? " + input embedding" : "",
               sl.head ? " + head" : "", policy::percent_text(st.policy, 1), st.policy.cpu_cache_compute,
               offload::format_bytes(st.peak_bytes[0]), offload::format_bytes(st.peak_bytes[1]),
               offload::format_bytes(st.peak_bytes[2]), st.prefill_seconds, st.decode_step_seconds);
  }
  fmt::print("predicted: prefill {:.1f} tok/s, decode {:.2f} tok/s, total {:.2f} tok/s ({:.1f} s per round of {} "
             "micro-batches); bubble share {:.1f}%\n",
             e.prefill_throughput, e.decode_throughput, e.total_throughput, e.prefill_seconds + e.decode_seconds, M,
             100 * e.bubble_share);
}

// The sizes, capacities, each tier's items and the step or block times behind an estimate.
void print_explanation(const policy::ModelShape& shape, const policy::HardwareProfile& hw, const policy::Workload& w,
                       const policy::PlanOptions& po, const policy::Estimate& e) {
  const auto& p = e.policy;
  const auto z = policy::model_sizes(policy::with_compression(shape, p));
  fmt::print("sizes: weights {} ({} per layer, embeddings {}), KV {} per token per layer, KV tokens per sequence {}\n",
             offload::format_bytes(z.total_weights), offload::format_bytes(z.layer_weights),
             offload::format_bytes(z.embedding_weights), offload::format_bytes(z.kv_per_token_layer),
             policy::kv_tokens(shape, w, po.kv));
  fmt::print("capacities (x{} safety): gpu {} | cpu {} | disk {}; activations in {}\n", hw.memory_safety,
             offload::format_bytes(hw.gpu_mem), offload::format_bytes(hw.cpu_mem), offload::format_bytes(hw.disk_mem),
             kernels::dtype_name(hw.activation_dtype));
  for (int tier = 0; tier < 3; ++tier)
    fmt::print("{} tier: {}\n", offload::tier_name(static_cast<offload::Tier>(tier)),
               items_text(e.memory[static_cast<std::size_t>(tier)]));
  if (e.continuous) {
    const policy::SlotStep& ss = e.slot_step;
    fmt::print("mean slot-step: {:.3f} prompt rows + {:.3f} decode rows attending over {:.1f} KV tokens, {:.2f} busy; "
               "prefill budget {} tokens a step\n",
               ss.prefill_rows, ss.decode_rows, ss.decode_rows > 0 ? ss.kv_attended / ss.decode_rows : 0.0, ss.busy,
               e.prefill_budget);
  } else {
    fmt::print("prefill {:.2f} s, decode {:.2f} s per block\n", e.prefill_seconds, e.decode_seconds);
  }
}

// The policies the search ranked best, as a table.
void print_ranked(const std::vector<policy::Estimate>& ranked, bool continuous) {
  fmt::print("top {} of the policies the search evaluated:\n", ranked.size());
  fmt::print("| rank | gbs x K | percent (WG WC CG CC AG AC) | ccc | prefix pool | total tok/s | {} | bottleneck |\n"
             "|---|---|---|---|---|---|---|---|---|\n",
             continuous ? "step s | steps" : "prefill s | decode s");
  for (std::size_t i = 0; i < ranked.size(); ++i) {
    const policy::Estimate& r = ranked[i];
    const std::string times =
        r.continuous ? fmt::format("{:.4f} | {:.0f}", r.decode_step_seconds, r.decode_seconds / r.decode_step_seconds)
                     : fmt::format("{:.1f} | {:.1f}", r.prefill_seconds, r.decode_seconds);
    // A plan that holds no prefixes once leaves the pool to the engine (auto): "-".
    fmt::print("| {} | {} x {} | [{}] | {} | {} | {:.3f} | {} | {} |\n", i + 1, r.policy.gpu_batch_size,
               r.policy.num_gpu_batches, policy::percent_text(r.policy, 1), r.policy.cpu_cache_compute ? "yes" : "no",
               r.policy.prefix_pool == "auto" ? "-" : r.policy.prefix_pool, r.total_throughput, times, r.bottleneck);
  }
}

// The chosen policy, its predicted throughput and memory.
void print_estimate(const engine::ModelConfig& cfg, const policy::HardwareProfile& hw, const policy::Workload& w,
                    const policy::Estimate& e) {
  const auto& p = e.policy;
  fmt::print("model: {} on {} ({}), {}, kv {}, weights {}, cache {}\n", cfg.name, hw.name, hw.source, workload_text(w),
             p.kv, engine::matrix_dtypes_text(engine::with_weight_dtype(cfg, p.weight_dtype(cfg.dtype))),
             kernels::dtype_name(p.cache_dtype(cfg.dtype)));
  fmt::print("policy: gpu batch {} x {} batches (block {}), percent [{}], cpu_cache_compute {}{}{}\n", p.gpu_batch_size,
             p.num_gpu_batches, p.block_size(), policy::percent_text(p, 1), p.cpu_cache_compute,
             p.prefix_pool == "auto" ? "" : ", prefix pool on " + p.prefix_pool, p.overlap ? "" : ", overlap off");
  if (e.continuous)
    fmt::print("predicted: {:.2f} tok/s generated (continuous batching), mean step {:.4f} s\n", e.total_throughput,
               e.decode_step_seconds);
  else
    fmt::print("predicted: prefill {:.1f} tok/s, decode {:.2f} tok/s, total {:.2f} tok/s ({:.1f} s per block)\n",
               e.prefill_throughput, e.decode_throughput, e.total_throughput, e.prefill_seconds + e.decode_seconds);
  fmt::print("memory: gpu {} | cpu {} | disk {}\nbottleneck: {}\n", offload::format_bytes(e.peak_bytes[0]),
             offload::format_bytes(e.peak_bytes[1]), offload::format_bytes(e.peak_bytes[2]), e.bottleneck);
}

}  // namespace

int plan_command(const PlanCliOptions& o) {
  if (o.pipeline > 1 && !o.out_file.empty())
    throw std::invalid_argument("--out writes one policy, but each pipeline stage has its own; run --pipeline N plans "
                                "them itself (or give every stage the same --policy)");
  constexpr std::size_t kExplained = 5;
  const job::PlannedJob p = job::plan_job(o, kExplained);
  if (p.pipeline) {
    print_pipeline(o, p);
    return 0;
  }
  print_estimate(p.config, p.hw, p.workload, p.estimate);
  if (o.explain) {
    print_explanation(p.shape, p.hw, p.workload, p.options, p.estimate);
    if (!p.ranked.empty()) print_ranked(p.ranked, p.estimate.continuous);
  }
  if (!o.out_file.empty()) offload::write_file_atomically(o.out_file, policy::policy_to_yaml(p.estimate.policy));
  return 0;
}

}  // namespace flexh2o::cli
