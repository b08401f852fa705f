#include "engine/cli/run_command.h"

#include <fmt/format.h>

#include <cstdio>

#include "engine/cli/compression_flags.h"
#include "engine/cli/number_checks.h"
#include "engine/cli/option_flags.h"
#include "engine/job/job.h"

namespace flexh2o::cli {

namespace {

// Where the placement goes: the policy, the tiers' shares and the schedule.
void add_placement_options(CLI::App* run, job::JobOptions& o) {
  const char* sched = "Placement and schedule";
  run->add_option("--policy", o.policy_file,
                  "policy YAML (flags below override its fields), or auto: plan with --hardware, then run")
      ->group(sched);
  run->add_option("--hardware", o.hardware, "hardware profile (file or built-in name) to plan with; default: this machine's memory and disk with built-in rates")->group(sched);
  run->add_option("--percent", o.percent,
                  "WG WC CG CC AG AC: percent of weights, KV cache and activations on gpu and cpu (the rest on disk)")
      ->expected(6)
      ->group(sched);
  run->add_option("--resident-embeddings", o.resident_embeddings,
                  "1: the embeddings, final norm and head live wholly on the gpu tier, never staged (--percent "
                  "then places the decoder layers); 0: they are split like every weight (default with --percent)")
      ->check(CLI::Range(0, 1))
      ->group(sched);
  run->add_option("--prefix-sharing", o.prefix_sharing,
                  "on (default): under continuous batching requests whose prompts start alike (e.g. shared "
                  "instructions) compute that prefix once; its KV is held once in a pool (--prefix-pool), each "
                  "request's own row starting after it, or where the pool fits on no tier a request copies it "
                  "from a slot's row "
                  "(docs/prefix-sharing.md; off with --kv eviction); copy: always the copy (the ablation of "
                  "holding once); off: each computes its whole prompt (the ablation baseline)")
      ->check(CLI::IsMember({"on", "copy", "off"}))
      ->group(sched);
  run->add_option("--cuda-graphs", o.cuda_graphs,
                  "on: decode steps that run wholly on a CUDA device (every weight, KV cache and hidden state on "
                  "the gpu tier, one GPU batch, dense, no KV eviction) are captured once per shape and replayed as "
                  "CUDA graphs, the same tokens and logits with fewer launches (docs/backends.md); off (default): "
                  "each op is launched on its own. No effect on the CPU backend")
      ->check(CLI::IsMember({"on", "off"}))
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
  run->add_option("--prefix-pool", o.prefix_pool,
                  "where prefixes held once live (docs/prefix-sharing.md): the first of gpu, cpu, disk where the "
                  "pool fits, from the one named (default auto: from gpu, or from the planner's choice)")
      ->check(CLI::IsMember({"auto", "gpu", "cpu", "disk"}))
      ->group(sched);
  add_compression_flags(run, o.compress, sched);
}

// How requests share the slots, and the tiers' capacities.
void add_batching_options(CLI::App* run, job::JobOptions& o) {
  const char* sched = "Placement and schedule";
  run->add_option("--batching", o.batching,
                  "continuous (default): a request that ends frees its slot for the next one at the next step; "
                  "fixed: blocks of gpu_batch_size x num_gpu_batches requests, each until its longest ends")
      ->check(CLI::IsMember({"continuous", "fixed"}))
      ->group(sched);
  run->add_option("--prefill-budget", o.prefill_budget,
                  "continuous batching: prompt tokens a GPU batch's step prefills for requests joining it "
                  "(one joins anyway when none else does), so that long prompts do not stall the others; default: "
                  "a GPU batch of the job's mean prompts on a GPU (at least 512), 512 on the CPU")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20))
      ->group(sched);
  run->add_option("--share-prefill", o.share_prefill,
                  "1: the n choices of a request (an OpenAI request's n) share "
                  "one prefill, its KV copied to each (default); 0: each prefills its own (the ablation baseline)")
      ->check(CLI::Range(0, 1))
      ->group(sched);
  run->add_option("--gpu-mem", o.gpu_mem, "gpu tier capacity, e.g. 16GiB (default: unlimited)")->group(sched);
  run->add_option("--cpu-mem", o.cpu_mem, "cpu tier capacity (default: unlimited)")->group(sched);
  run->add_option("--disk-mem", o.disk_mem, "disk tier capacity (default: unlimited)")->group(sched);
  run->add_option("--offload-dir", o.offload_dir, "directory of the disk tier (default: a fresh temp directory)")
      ->group(sched);
}

}  // namespace

CLI::App* add_run_command(CLI::App& app, job::JobOptions& o) {
  auto* run = app.add_subcommand("run", "Generate text for a batch of prompts (default: the embedded stories260K model)");
  run->add_option("--model", o.model,
                  "Hugging Face directory, llama2.c .bin, model YAML or built-in config name (with --dummy); "
                  "default: the embedded stories260K");
  run->add_option("--tokenizer", o.tokenizer, "tokenizer.json, llama2.c tok*.bin, or a directory with vocab.json + merges.txt");
  auto* p = run->add_option("--prompt", o.prompt, "one prompt text (repeated --batch times)");
  run->add_option("--prompts", o.prompts_file, "JSONL file of {\"id\", \"prompt\"|\"tokens\"}")->excludes(p);
  run->add_option("--out", o.out_file, "JSONL output of {\"id\", \"text\", \"tokens\"}, one line per prompt");
  run->add_option("--gen-len", o.gen_len,
                  fmt::format("new tokens per prompt (default {} for the embedded model, else {})", job::kEmbeddedGenLen,
                              policy::kDefaultGenLen))
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

  add_placement_options(run, o);
  add_batching_options(run, o);
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
  run->add_flag("--quiet", o.quiet,
                "no progress line (on a terminal a bar redrawn as steps end, else a line each 30 s and each tenth of "
                "the requests: done, prompt and generated tok/s, elapsed, time left)");
  run->add_flag("--explain", o.explain,
                "after the run, the planner's predicted throughput, step time, phases (a fixed block's prefill and "
                "decode) and memory per tier next to the measured ones (--metrics has them under \"predicted\" "
                "either way)");
  return run;
}

int run_command(const job::JobOptions& o) {
  const job::FrontEnd front{.say = [](const std::string& text) { fmt::print(stderr, "{}\n", text); },
                            .option_name = flag_of};
  const job::JobEnd end = job::run_job(o, front);
  fmt::print(stderr, "{}", end.text);
  return end.status;
}

}  // namespace flexh2o::cli
