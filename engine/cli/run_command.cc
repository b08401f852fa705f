#include "engine/cli/run_command.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <optional>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include "engine/block_scheduler.h"
#include "engine/cli/interrupts.h"
#include "engine/cli/number_checks.h"
#include "engine/cli/run_job.h"
#include "engine/distributed/launch.h"
#include "engine/model_shape.h"
#include "offload/text_file.h"
#include "engine/model_source.h"
#include "engine/prompts.h"
#include "kernels/backend.h"
#ifdef FLEXH2O_HAVE_MPI
#include "engine/cli/run_distributed.h"
#endif

namespace flexh2o::cli {

using namespace flexh2o::engine;

CLI::App* add_run_command(CLI::App& app, RunOptions& o) {
  auto* run = app.add_subcommand("run", "Generate text for a batch of prompts (default: the embedded stories260K model)");
  run->add_option("--model", o.model,
                  "Hugging Face directory, llama2.c .bin, model YAML or built-in config name (with --dummy); "
                  "default: the embedded stories260K");
  run->add_option("--tokenizer", o.tokenizer, "tokenizer.json, llama2.c tok*.bin, or a directory with vocab.json + merges.txt");
  auto* p = run->add_option("--prompt", o.prompt, "one prompt text (repeated --batch times)");
  run->add_option("--prompts", o.prompts_file, "JSONL file of {\"id\", \"prompt\"|\"tokens\"}")->excludes(p);
  run->add_option("--out", o.out_file, "JSONL output of {\"id\", \"text\", \"tokens\"}, one line per prompt");
  run->add_option("--gen-len", o.gen_len, "new tokens per prompt (default 256 for the embedded model, else 32)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  run->add_option("--batch", o.batch, "number of prompts for --prompt or synthetic prompts (default: one block)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  run->add_option("--prompt-len", o.prompt_len, "length of synthetic random prompts")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  run->add_option("--temperature", o.temperature, "0 = greedy")->check(kFiniteNumber & CLI::Range(0.0f, 100.0f));
  run->add_option("--top-p", o.top_p, "nucleus sampling mass")->check(kFiniteNumber & CLI::Range(0.0f, 1.0f));
  run->add_option("--seed", o.seed, "seed of sampling and dummy weights")->check(kUint64);
  run->add_flag("--dummy", o.dummy, "random weights of the model's shape (no checkpoint needed)");
  run->add_flag("--ignore-eos", o.ignore_eos, "generate --gen-len tokens per prompt even past the model's end-of-sequence tokens");
  run->add_option("--dtype", o.dtype, "storage dtype of weight matrices: f32, f16 or bf16")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
  run->add_option("--backend", o.backend, "compute backend: auto (CUDA when a GPU is usable, else CPU), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  run->add_option("--compute-dtype", o.compute_dtype,
                  "how projections multiply: auto (bf16 for 16-bit weights where the hardware has bf16 units, else "
                  "f32), f32 or bf16")
      ->check(CLI::IsMember({"auto", "f32", "bf16"}));

  const char* sched = "Placement and schedule";
  run->add_option("--policy", o.policy_file,
                  "policy YAML (flags below override its fields), or auto: plan with --hardware, then run")
      ->group(sched);
  run->add_option("--hardware", o.hardware, "hardware profile (file or built-in name) to plan with; default: this machine's memory and disk with built-in rates")->group(sched);
  run->add_option("--percent", o.percent,
                  "WG WC CG CC AG AC: percent of weights, KV cache and activations on gpu and cpu (the rest on disk)")
      ->expected(6)
      ->group(sched);
  run->add_option("--gpu-batch-size", o.gpu_batch_size, "sequences per GPU batch")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20))
      ->group(sched);
  run->add_option("--num-gpu-batches", o.num_gpu_batches, "GPU batches per block (zig-zag)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20))
      ->group(sched);
  run->add_option("--overlap", o.overlap, "1: overlap transfers with compute (default), 0: run them in line")
      ->check(CLI::Range(0, 1))
      ->group(sched);
  run->add_option("--sep-layer", o.sep_layer, "1: attention and MLP load separately (default), 0: together")
      ->check(CLI::Range(0, 1))
      ->group(sched);
  run->add_option("--pin-weight", o.pin_weight, "1: pin cpu-tier memory (default), 0: pageable")
      ->check(CLI::Range(0, 1))
      ->group(sched);
  run->add_flag("--cpu-cache-compute", o.cpu_cache_compute, "attend over a cpu-homed KV cache on the CPU")->group(sched);
  run->add_option("--kv", o.kv, "KV eviction policy, e.g. h2o:0.2, h2o:128, h2o:heavy=0.1,recent=0.1, local:0.2 "
                                "(default full); the KV tier then holds only the budget")
      ->group(sched);
  run->add_option("--expert-loading", o.expert_loading,
                  "mixture-of-experts: routed (fetch only the experts the batch routes to), all, or auto (routed "
                  "unless about all experts are expected active; default)")
      ->check(CLI::IsMember({"auto", "routed", "all"}))
      ->group(sched);
  run->add_option("--expert-slots", o.expert_slots,
                  "mixture-of-experts: experts a weight staging slot holds per MoE layer (default: those a decode "
                  "step of the block is expected to route to, at least top_k); a batch routed to more runs its "
                  "MoE layer in chunks of experts")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20))
      ->group(sched);
  o.compress.add_to(run, sched);
  run->add_option("--gpu-mem", o.gpu_mem, "gpu tier capacity, e.g. 16GiB (default: unlimited)")->group(sched);
  run->add_option("--cpu-mem", o.cpu_mem, "cpu tier capacity (default: unlimited)")->group(sched);
  run->add_option("--disk-mem", o.disk_mem, "disk tier capacity (default: unlimited)")->group(sched);
  run->add_option("--offload-dir", o.offload_dir, "directory of the disk tier (default: a fresh temp directory)")
      ->group(sched);
  run->add_flag("--resume", o.resume, "skip prompts whose ids are already in --out and append the rest");
  const char* dist = "Several ranks (under mpirun or srun)";
  run->add_option("--pipeline", o.pipeline,
                  "pipeline parallel over N ranks (N = the launcher's ranks): each holds a slice of the layers; "
                  "default: data parallel, each rank runs the whole model on its share of the prompts")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 16))
      ->group(dist);
  run->add_option("--micro-batches", o.micro_batches, "blocks in flight in the pipeline (default: N)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 16))
      ->group(dist);
  run->add_option("--metrics", o.metrics_file, "write throughput, peak bytes per tier and time per primitive as JSON");
  run->add_option("--trace", o.trace_file, "write a Chrome trace (open in Perfetto), one track per stream");
  return run;
}

namespace {

int run_one_process(const RunOptions& o) {
  if (o.pipeline > 1)
    throw std::invalid_argument("--pipeline " + std::to_string(o.pipeline) + " runs over " + std::to_string(o.pipeline) +
                                " ranks: start it with mpirun -np " + std::to_string(o.pipeline) + " (or srun)");
  if (o.micro_batches) throw std::invalid_argument("--micro-batches is for pipeline runs (--pipeline N under mpirun)");
  const InterruptWatch interrupts;  // before any thread starts
  RunSetup s = open_run(o);
  ModelSource& m = s.model;
  kernels::Backend& backend = *s.backend;
  const std::int64_t gen_len = s.gen_len;

  std::vector<PromptItem> items;
  if (s.auto_policy) {
    // Plan for the prompts' length (synthetic prompts: --prompt-len), then run the plan within
    // the profile's capacities unless --*-mem say otherwise.
    const bool synthetic = o.prompts_file.empty() && o.prompt.empty() && !m.tokenizer;
    std::int64_t prompt_len = o.prompt_len, prompts = o.batch.value_or(1);
    if (!synthetic) {
      items = gather_prompts(o, m, prompts);
      prompts = static_cast<std::int64_t>(items.size());
      prompt_len = longest_prompt(items);
    }
    const policy::HardwareProfile hw = planning_profile(o, s);
    const policy::Estimate e =
        policy::plan(engine::model_shape(m.config), hw, {prompt_len, gen_len}, plan_options(o, s, prompts));
    adopt_plan(o, s, e.policy, hw);
    fmt::print(stderr, "{}\n", planned_line(hw, e));
  }
  const policy::Policy& pol = s.policy;
  offload::TierOptions to = s.tiers;
  to.pin_host = pol.pin_weight;

  const std::int64_t count = o.batch.value_or(s.placed ? pol.block_size() : 1);
  if (items.empty()) items = gather_prompts(o, m, count);
  std::vector<std::vector<std::int32_t>> all_prompts;
  std::vector<std::string> ids;
  for (const auto& it : items) {
    all_prompts.push_back(it.tokens);
    ids.push_back("id " + it.id_json);
  }
  check_prompts(m.config, all_prompts, gen_len, ids);  // fail before loading weights
  if (!s.auto_policy) {
    check_placement_fits(o, s, items);
    to.gpu_bytes = s.tiers.gpu_bytes;
    to.cpu_bytes = s.tiers.cpu_bytes;
  }

  std::optional<JsonlWriter> out;
  if (!o.out_file.empty()) out.emplace(o.out_file, o.resume);
  // Prompts still to do, by index (the index is the sampling stream, so a resumed job
  // samples exactly what the uninterrupted one would have).
  std::vector<std::size_t> todo;
  for (std::size_t i = 0; i < items.size(); ++i)
    if (!out || !out->done_ids().count(items[i].id_json)) todo.push_back(i);
  if (o.resume) fmt::print(stderr, "resuming: {} of {} prompts already in {}\n", items.size() - todo.size(), items.size(), o.out_file);

  offload::Tiers tiers(backend, to);
  std::optional<offload::Trace> trace;
  if (!o.metrics_file.empty() || !o.trace_file.empty()) trace.emplace();
  BlockScheduler sched(backend, tiers, m.config, *m.weights, pol, trace ? &*trace : nullptr);

  GenerationResult total;
  const auto block = static_cast<std::size_t>(pol.block_size());
  const std::size_t blocks = (todo.size() + block - 1) / block;
  const bool progress = ::isatty(STDERR_FILENO) == 1;
  bool stopped = false;
  std::size_t done_blocks = 0;
  for (std::size_t first = 0; first < todo.size(); first += block) {
    if (interrupts.stop_requested()) {
      stopped = true;
      break;
    }
    const std::size_t last = std::min(todo.size(), first + block);
    GenerationRequest req;
    req.max_new_tokens = gen_len;
    req.sampling = {o.temperature, o.top_p, o.seed};
    for (std::size_t t = first; t < last; ++t) {
      req.prompts.push_back(items[todo[t]].tokens);
      req.streams.push_back(todo[t]);
    }
    req.on_step = [&, b = first / block](std::int64_t step, std::int64_t steps) {
      if (interrupts.abandon_requested())
        throw Interrupted("interrupted: the unfinished block was abandoned; finished blocks are in " +
                          (o.out_file.empty() ? std::string("the output") : o.out_file) +
                          (o.out_file.empty() ? std::string() : "; rerun with --resume to continue"));
      if (progress) fmt::print(stderr, "\rblock {}/{}, step {}/{}   ", b + 1, blocks, step + 1, steps);
    };
    GenerationResult r = sched.generate(req);
    if (progress) fmt::print(stderr, "\r\033[K");
    for (std::size_t t = first; t < last; ++t) {
      const std::string line = result_line(o, m, items[todo[t]], r.tokens[t - first]);
      if (out)
        out->add_line(line);
      else
        fmt::print("{}", line);
    }
    if (out) out->flush();
    total.add(r);
    ++done_blocks;
  }
  std::fflush(stdout);
  if (stopped) {
    fmt::print(stderr, "flexh2o: interrupted: stopped after {} of {} blocks{}\n", done_blocks, blocks,
               o.out_file.empty() ? "" : "; rerun with --resume to continue");
  }
  // FlexGen's report: sizes (as stored), peak memory per tier, latency and throughput.
  const ModelConfig c = with_weight_dtype(m.config, pol.weight_dtype(m.config.dtype));
  const double all_s = total.prefill_seconds + total.decode_seconds;
  const double prefill_tput = total.prefill_throughput(), decode_tput = total.decode_throughput(),
               total_tput = total.total_throughput();
  const std::int64_t max_prompt = std::ranges::max(all_prompts, {}, &std::vector<std::int32_t>::size).size();
  const std::int64_t cache_bytes = 2 * c.n_layers * pol.block_size() * (max_prompt + gen_len) * c.n_kv_heads *
                                   kernels::kv_slot_bytes(pol.cache_dtype(m.config.dtype), c.head_dim);
  const std::int64_t hidden_bytes = pol.block_size() * max_prompt * c.hidden * 4;
  using offload::Tier;
  auto peak = [&](Tier t) { return tiers.budget(t).peak(); };
  const auto pct = pol.percent();
  fmt::print(stderr,
             "model: {} ({} layers, hidden {}, {} weights)\n"
             "model size: {} | cache size: {} | hidden size (prefill): {}\n"
             "policy: gpu batch {} x {} batches, percent [{:g} {:g} {:g} {:g} {:g} {:g}], overlap {}, sep_layer {}, "
             "cpu_cache_compute {}, kv {}, cache {}, compute {}\n"
             "peak memory: gpu {} | cpu {} | disk {}\n"
             "prompts: {}, prompt tokens: {}, generated tokens: {}\n"
             "prefill: {:.3f} s, {:.1f} tok/s | decode: {:.3f} s, {:.1f} tok/s | total: {:.3f} s, {:.1f} tok/s\n",
             m.description, c.n_layers, c.hidden, matrix_dtypes_text(c),
             offload::format_bytes(tensor_bytes(c)), offload::format_bytes(cache_bytes),
             offload::format_bytes(hidden_bytes), pol.gpu_batch_size, pol.num_gpu_batches, pct[0], pct[1], pct[2],
             pct[3], pct[4], pct[5], pol.overlap, pol.sep_layer, pol.cpu_cache_compute, pol.kv,
             kernels::dtype_name(pol.cache_dtype(c.dtype)), kernels::dtype_name(c.compute_dtype), offload::format_bytes(peak(Tier::Gpu)), offload::format_bytes(peak(Tier::Cpu)),
             offload::format_bytes(peak(Tier::Disk)), items.size(), total.prompt_tokens, total.generated_tokens,
             total.prefill_seconds, prefill_tput, total.decode_seconds, decode_tput, all_s, total_tput);
  // Mixture-of-experts: the expert weights each step fetched into staging slots.
  const ExpertLoadStats& experts = sched.expert_loads();
  const std::int64_t decode_tokens = total.generated_tokens - total.sequences;
  const std::int64_t decode_expert_bytes = experts.bytes() - (experts.bytes_by_step.empty() ? 0 : experts.bytes_by_step[0]);
  const std::int64_t moe_layers = std::ranges::count(c.moe.layers, true);
  if (c.moe.experts > 0 && !experts.experts_by_step.empty())
    fmt::print(stderr,
               "experts: {} loading, {} per staging slot; per step {} of {} fetched ({} layers x {}); decode moved {} "
               "of expert weights per token\n",
               pol.expert_loading, pol.expert_slot_count(c.moe.experts, c.moe.top_k), fmt::join(experts.experts_by_step, " "), moe_layers * c.moe.experts, moe_layers,
               c.moe.experts,
               offload::format_bytes(decode_tokens > 0 ? decode_expert_bytes / decode_tokens : 0));
  if (!o.metrics_file.empty()) {
    nlohmann::json j = {{"model", m.description},
                        {"policy",
                         {{"gpu_batch_size", pol.gpu_batch_size},
                          {"num_gpu_batches", pol.num_gpu_batches},
                          {"percent", pct},
                          {"overlap", pol.overlap},
                          {"sep_layer", pol.sep_layer},
                          {"pin_weight", pol.pin_weight},
                          {"cpu_cache_compute", pol.cpu_cache_compute},
                          {"kv", pol.kv},
                          {"compress_weight", pol.compress_weight},
                          {"compress_cache", pol.compress_cache},
                          {"compress_bits", pol.compress_bits},
                          {"expert_loading", pol.expert_loading},
                          {"expert_slots", pol.expert_slot_count(c.moe.experts, c.moe.top_k)}}},
                        {"prompts", items.size()},
                        {"prompt_tokens", total.prompt_tokens},
                        {"generated_tokens", total.generated_tokens},
                        {"prefill_seconds", total.prefill_seconds},
                        {"decode_seconds", total.decode_seconds},
                        {"prefill_throughput", prefill_tput},
                        {"decode_throughput", decode_tput},
                        {"total_throughput", total_tput},
                        {"model_bytes", tensor_bytes(c)},
                        {"cache_bytes", cache_bytes},
                        {"hidden_bytes", hidden_bytes},
                        {"peak_bytes", {{"gpu", peak(Tier::Gpu)}, {"cpu", peak(Tier::Cpu)}, {"disk", peak(Tier::Disk)}}},
                        {"time_by_primitive", trace->time_by_primitive()}};
    if (c.moe.experts > 0)
      j["experts"] = {{"experts", c.moe.experts},
                      {"top_k", c.moe.top_k},
                      {"moe_layers", moe_layers},
                      {"loaded_by_step", experts.experts_by_step},
                      {"bytes_by_step", experts.bytes_by_step},
                      {"bytes", experts.bytes()},
                      {"decode_bytes_per_token", decode_tokens > 0 ? decode_expert_bytes / decode_tokens : 0}};
    offload::write_file_atomically(o.metrics_file, j.dump(2) + "\n");
  }
  if (!o.trace_file.empty()) trace->write_chrome_json(o.trace_file);
  return stopped ? 130 : 0;
}

}  // namespace

int run_command(const RunOptions& o) {
  if (const auto launch = distributed::mpi_launch()) {
#ifdef FLEXH2O_HAVE_MPI
    return run_distributed(o, [&] { return run_one_process(o); });
#else
    if (launch->ranks != 1 || o.pipeline > 1)
      throw std::invalid_argument("this flexh2o was built without MPI, so under mpirun/srun every rank would run the "
                                  "whole job; rebuild with -DFLEXH2O_MPI=ON (Open MPI: libopenmpi-dev) or run one process");
#endif
  }
  return run_one_process(o);
}

}  // namespace flexh2o::cli
