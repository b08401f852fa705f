#include "engine/cli/run_command.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <optional>

#include "engine/cli/file_roles.h"
#include "engine/cli/number_checks.h"
#include "engine/cli/run_job.h"
#include "engine/serving/interrupts.h"
#include "engine/serving/engine.h"
#include "engine/serving/run_report.h"
#include "engine/distributed/launch.h"
#include "engine/model/model_shape.h"
#include "engine/loaders/model_source.h"
#include "engine/serving/prompts.h"
#include "kernels/backend.h"
#if defined(FLEXH2O_HAVE_CUDA) && FLEXH2O_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif
#ifdef FLEXH2O_HAVE_MPI
#include "engine/cli/run_distributed.h"
#endif

namespace flexh2o::cli {

using namespace flexh2o::engine;

namespace {

// How the decode steps ran under --cuda-graphs on (docs/backends.md, "Decode steps in CUDA
// graphs"), for the GPU runs that measure it.
void print_graph_steps(const kernels::Backend& be) {
#if defined(FLEXH2O_HAVE_CUDA) && FLEXH2O_HAVE_CUDA
  if (const auto* cuda = dynamic_cast<const kernels::cuda::CudaBackend*>(&be)) {
    const kernels::cuda::CudaBackend::GraphCounts c = cuda->graph_counts();
    fmt::print(stderr, "cuda graphs: {} decode steps replayed, {} captured, {} recorded, {} missed, {} interrupted\n",
               c.replayed, c.captured, c.recorded, c.missed, c.interrupted);
  }
#else
  (void)be;
#endif
}

// Where the placement goes: the policy, the tiers' shares and the schedule.
void add_placement_options(CLI::App* run, RunOptions& o) {
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
  o.compress.add_to(run, sched);
}

// How requests share the slots, and the tiers' capacities.
void add_batching_options(CLI::App* run, RunOptions& o) {
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

CLI::App* add_run_command(CLI::App& app, RunOptions& o) {
  auto* run = app.add_subcommand("run", "Generate text for a batch of prompts (default: the embedded stories260K model)");
  run->add_option("--model", o.model,
                  "Hugging Face directory, llama2.c .bin, model YAML or built-in config name (with --dummy); "
                  "default: the embedded stories260K");
  run->add_option("--tokenizer", o.tokenizer, "tokenizer.json, llama2.c tok*.bin, or a directory with vocab.json + merges.txt");
  auto* p = run->add_option("--prompt", o.prompt, "one prompt text (repeated --batch times)");
  run->add_option("--prompts", o.prompts_file, "JSONL file of {\"id\", \"prompt\"|\"tokens\"}")->excludes(p);
  run->add_option("--out", o.out_file, "JSONL output of {\"id\", \"text\", \"tokens\"}, one line per prompt");
  run->add_option("--gen-len", o.gen_len,
                  fmt::format("new tokens per prompt (default {} for the embedded model, else {})", kEmbeddedGenLen,
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
                "after the run, the planner's predicted throughput, step time and memory per tier next to the "
                "measured ones (--metrics has them under \"predicted\" either way)");
  return run;
}

namespace {

void check_one_process_flags(const RunOptions& o) {
  if (o.pipeline > 1)
    throw std::invalid_argument("--pipeline " + std::to_string(o.pipeline) + " runs over " + std::to_string(o.pipeline) +
                                " ranks: start it with mpirun -np " + std::to_string(o.pipeline) + " (or srun)");
  if (o.micro_batches) throw std::invalid_argument("--micro-batches is for pipeline runs (--pipeline N under mpirun)");
}

// The job's requests (`given`: an OpenAI batch job's); with an automatic policy, first plans for
// their length (synthetic prompts: --prompt-len), then runs the plan within the profile's
// capacities unless --*-mem say otherwise.
std::vector<serving::Request> plan_and_gather(const RunOptions& o, RunSetup& s, const std::vector<serving::Request>* given) {
  std::vector<serving::Request> requests;
  if (given) requests = *given;
  if (s.auto_policy) {
    const bool synthetic = o.prompts_file.empty() && o.prompt.empty() && !s.model.tokenizer;
    std::int64_t prompts = o.batch.value_or(1);
    if (!synthetic) {
      if (!given) requests = make_requests(o, s, gather_prompts(o, s.model, prompts));
      prompts = static_cast<std::int64_t>(requests.size());
    }
    const policy::HardwareProfile hw = planning_profile(o, s);
    const policy::Estimate e = policy::plan(
        engine::model_shape(s.model.config), hw,
        synthetic ? synthetic_workload(o, prompts, s.gen_len) : job_workload(o, s.model.config, requests, s.gen_len),
        plan_options(o, s, prompts));
    adopt_plan(o, s, e.policy, hw);
    s.predicted = e;
    fmt::print(stderr, "{}\n{}", planned_line(hw, e), o.hardware.empty() ? uncalibrated_note(o) : "");
  }
  if (requests.empty())
    requests = make_requests(o, s, gather_prompts(o, s.model, o.batch.value_or(s.placed ? s.policy.block_size() : 1)));
  return requests;
}

int run_one_process(const RunOptions& o) {
  check_one_process_flags(o);
  const serving::InterruptWatch interrupts;  // before any thread starts
  const bool openai = is_openai_job(o);
  std::optional<serving::ResultFile> out;
  open_out(o, out, openai ? serving::ResultFormat::OpenAi : serving::ResultFormat::Simple);
  RunSetup s = open_run(o);
  std::optional<serving::OpenAiJob> oj;
  if (openai) {
    oj = open_openai_run(o, s, out);
    if (oj->requests.empty()) {
      fmt::print(stderr, "{}: no request to run\n", o.prompts_file);
      return 0;
    }
  }
  const std::vector<serving::Request> requests = plan_and_gather(o, s, oj ? &oj->requests : nullptr);
  serving::check_requests(s.model.config, requests);  // fail before loading weights
  if (!s.auto_policy) check_placement_fits(o, s, requests, planning_profile(o, s));  // within this machine's memory
  const std::vector<serving::Request> todo = serving::requests_to_run(requests, out, o.resume, o.out_file);

  settle_compute_dtype(o, s);
  serving::EngineOptions eo = engine_options(o, s);
  eo.progress = progress_options(o, s);
  serving::Engine engine(*s.backend, s.model.config, *s.model.weights, std::move(eo), &interrupts);
  JobResults results(o, s, out, oj ? &*oj : nullptr);
  const serving::JobOutcome done = engine.run(todo, [&](std::span<const std::size_t> at, const GenerationResult& r) {
    results.add(serving::requests_at(todo, at), r);
  });
  if (done.stopped)
    fmt::print(stderr, "{}", serving::stopped_message("the run", done.finished_requests, done.requests, o.out_file));

  serving::RunReport report = engine.report(s.model.description, requests, s.gen_len, done);
  report.compute_why = s.compute_why;
  if (s.predicted) report.predicted = serving::prediction_of(*s.predicted);
  report.explain = o.explain;
  if (s.constraints) report.structured_output = s.constraints->report();
  fmt::print(stderr, "{}{}", report.text(), s.constraints ? s.constraints->summary_line() : "");
  if (o.cuda_graphs == "on") print_graph_steps(*s.backend);
  report.write_files(o.metrics_file, o.trace_file, engine.trace());
  return done.stopped ? 130 : 0;
}

}  // namespace

int run_command(const RunOptions& o) {
  const FileRole reads[] = {{"--prompts", o.prompts_file}, {"--model", o.model}, {"--tokenizer", o.tokenizer},
                            {"--policy", o.policy_file == "auto" ? "" : o.policy_file}, {"--hardware", o.hardware}};
  const FileRole writes[] = {{"--out", o.out_file}, {"--metrics", o.metrics_file}, {"--trace", o.trace_file}};
  check_files_apart(reads, writes);
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
