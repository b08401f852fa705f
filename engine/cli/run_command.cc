#include "engine/cli/run_command.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <random>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include "engine/block_scheduler.h"
#include "engine/cli/interrupts.h"
#include "engine/machine_profile.h"
#include "engine/model_shape.h"
#include "offload/text_file.h"
#include "engine/model_source.h"
#include "engine/prompts.h"
#include "kernels/backend.h"

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
  run->add_option("--temperature", o.temperature, "0 = greedy")->check(CLI::Range(0.0f, 100.0f));
  run->add_option("--top-p", o.top_p, "nucleus sampling mass")->check(CLI::Range(0.0f, 1.0f));
  run->add_option("--seed", o.seed, "seed of sampling and dummy weights");
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
  o.compress.add_to(run, sched);
  run->add_option("--gpu-mem", o.gpu_mem, "gpu tier capacity, e.g. 16GiB (default: unlimited)")->group(sched);
  run->add_option("--cpu-mem", o.cpu_mem, "cpu tier capacity (default: unlimited)")->group(sched);
  run->add_option("--disk-mem", o.disk_mem, "disk tier capacity (default: unlimited)")->group(sched);
  run->add_option("--offload-dir", o.offload_dir, "directory of the disk tier (default: a fresh temp directory)")
      ->group(sched);
  run->add_flag("--resume", o.resume, "skip prompts whose ids are already in --out and append the rest");
  run->add_option("--metrics", o.metrics_file, "write throughput, peak bytes per tier and time per primitive as JSON");
  run->add_option("--trace", o.trace_file, "write a Chrome trace (open in Perfetto), one track per stream");
  return run;
}

namespace {

// `count` prompts when none are given: --prompt repeated, or synthetic ones.
std::vector<PromptItem> gather_prompts(const RunOptions& o, const ModelSource& m, std::int64_t count) {
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
  tokenize_prompts(items, m.tokenizer.get(), m.config.bos_id, m.config.name);
  return items;
}


policy::Policy make_policy(const RunOptions& o) {
  policy::Policy p = o.policy_file.empty() ? policy::Policy{} : policy::load_policy_file(o.policy_file);
  if (!o.percent.empty()) p.set_percent({o.percent[0], o.percent[1], o.percent[2], o.percent[3], o.percent[4], o.percent[5]});
  // Without a policy file or --gpu-batch-size, all prompts of --batch form one GPU batch.
  if (o.gpu_batch_size) p.gpu_batch_size = *o.gpu_batch_size;
  else if (o.policy_file.empty()) p.gpu_batch_size = o.batch.value_or(1);
  if (o.num_gpu_batches) p.num_gpu_batches = *o.num_gpu_batches;
  if (o.overlap) p.overlap = *o.overlap != 0;
  if (o.sep_layer) p.sep_layer = *o.sep_layer != 0;
  if (o.pin_weight) p.pin_weight = *o.pin_weight != 0;
  if (o.cpu_cache_compute) p.cpu_cache_compute = true;
  if (!o.kv.empty()) p.kv = o.kv;
  o.compress.apply(p);
  p.validate(o.policy_file.empty() ? "policy flags" : o.policy_file);
  return p;
}

std::int64_t capacity(const std::string& text, const char* flag) {
  if (text.empty()) return offload::Budget::kUnlimited;
  try {
    return offload::parse_bytes(text);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string(flag) + ": " + e.what());
  }
}

std::int64_t tensor_bytes(const ModelConfig& c) {
  std::int64_t b = 0;
  for (const auto& w : weight_specs(c)) b += w.rows * kernels::row_bytes(w.dtype(c), w.cols);
  return b;
}

}  // namespace

int run_command(const RunOptions& o) {
  if (o.resume && o.out_file.empty()) throw std::invalid_argument("--resume needs --out (the results to resume from)");
  const InterruptWatch interrupts;  // before any thread starts
  ModelOptions mo;
  mo.model = o.model;
  mo.tokenizer = o.tokenizer;
  mo.dummy = o.dummy;
  mo.seed = o.seed;
  if (!o.dtype.empty()) mo.dtype = kernels::parse_dtype(o.dtype);
  // Throughput first: a batch job without placement flags runs the planner's policy (as large a
  // batch as fits this machine or --hardware, and the --*-mem limits); so does --policy auto.
  const bool placed = (!o.policy_file.empty() && o.policy_file != "auto") || !o.percent.empty() || o.gpu_batch_size ||
                      o.num_gpu_batches;
  const bool batch_job = !o.prompts_file.empty() || o.batch.value_or(1) > 1;
  const bool auto_policy = o.policy_file == "auto" || (!placed && batch_job);
  policy::Policy pol = auto_policy ? policy::Policy{} : make_policy(o);
  offload::TierOptions to;
  to.gpu_bytes = capacity(o.gpu_mem, "--gpu-mem");
  to.cpu_bytes = capacity(o.cpu_mem, "--cpu-mem");
  to.disk_bytes = capacity(o.disk_mem, "--disk-mem");
  to.offload_dir = o.offload_dir;
  ModelSource m = open_model(mo);
  auto backend = kernels::make_backend(o.backend);
  m.config.compute_dtype = choose_compute_dtype(o.compute_dtype, m.config.dtype, *backend);
  if (o.ignore_eos) m.config.stop_ids.clear();
  const std::int64_t gen_len = o.gen_len.value_or(o.model.empty() ? 256 : 32);

  std::vector<PromptItem> items;
  if (auto_policy) {
    // Plan for the prompts' length (synthetic prompts: --prompt-len), then run the plan within
    // the profile's capacities unless --*-mem say otherwise.
    const bool synthetic = o.prompts_file.empty() && o.prompt.empty() && !m.tokenizer;
    std::int64_t prompt_len = o.prompt_len, prompts = o.batch.value_or(1);
    if (!synthetic) {
      items = gather_prompts(o, m, prompts);
      prompts = static_cast<std::int64_t>(items.size());
      prompt_len = 0;
      for (const auto& it : items) prompt_len = std::max<std::int64_t>(prompt_len, static_cast<std::int64_t>(it.tokens.size()));
    }
    policy::HardwareProfile hw =
        o.hardware.empty() ? this_machine_profile(*backend, o.offload_dir) : hardware_profile(o.hardware);
    for (auto [bytes, field] : {std::pair{to.gpu_bytes, &hw.gpu_mem}, std::pair{to.cpu_bytes, &hw.cpu_mem},
                                std::pair{to.disk_bytes, &hw.disk_mem}})
      if (bytes != offload::Budget::kUnlimited) *field = bytes;
    policy::PlanOptions po;
    po.kv = policy::parse_kv_spec(o.kv.empty() ? "full" : o.kv);
    o.compress.apply(po);
    // Attention over a cpu-homed KV in place needs a CPU backend beside a device one (not yet).
    po.allow_cpu_cache_compute = backend->kind() == kernels::DeviceKind::Cpu;
    po.max_block = std::max<std::int64_t>(prompts, 1);  // no block larger than the job
    const policy::Estimate e = policy::plan(engine::model_shape(m.config), hw, {prompt_len, gen_len}, po);
    pol = e.policy;
    // Schedule flags still apply to the planned placement.
    if (o.overlap) pol.overlap = *o.overlap != 0;
    if (o.sep_layer) pol.sep_layer = *o.sep_layer != 0;
    if (o.pin_weight) pol.pin_weight = *o.pin_weight != 0;
    to.gpu_bytes = hw.gpu_mem;
    to.cpu_bytes = hw.cpu_mem;
    to.disk_bytes = hw.disk_mem;
    const auto pct = pol.percent();
    fmt::print(stderr, "planned for {}: gpu batch {} x {}, percent [{:.1f} {:.1f} {:.1f} {:.1f} {:.1f} {:.1f}], "
                       "cpu_cache_compute {}; predicted total {:.2f} tok/s\n",
               hw.name, pol.gpu_batch_size, pol.num_gpu_batches, pct[0], pct[1], pct[2], pct[3], pct[4], pct[5],
               pol.cpu_cache_compute, e.total_throughput);
  }
  to.pin_host = pol.pin_weight;

  const std::int64_t count = o.batch.value_or(placed ? pol.block_size() : 1);
  if (items.empty()) items = gather_prompts(o, m, count);
  std::vector<std::vector<std::int32_t>> all_prompts;
  std::vector<std::string> ids;
  for (const auto& it : items) {
    all_prompts.push_back(it.tokens);
    ids.push_back("id " + it.id_json);
  }
  check_prompts(m.config, all_prompts, gen_len, ids);  // fail before loading weights

  std::optional<JsonlWriter> out;
  if (!o.out_file.empty()) out.emplace(o.out_file, o.resume);
  // Prompts still to do, by index (the index is the sampling stream, so a resumed job
  // samples exactly what the uninterrupted one would have).
  std::vector<std::size_t> todo;
  for (std::size_t i = 0; i < items.size(); ++i)
    if (!out || !out->done_ids().count(items[i].id_json)) todo.push_back(i);
  if (o.resume) fmt::print(stderr, "resuming: {} of {} prompts already in {}\n", items.size() - todo.size(), items.size(), o.out_file);

  offload::Tiers tiers(*backend, to);
  std::optional<offload::Trace> trace;
  if (!o.metrics_file.empty() || !o.trace_file.empty()) trace.emplace();
  BlockScheduler sched(*backend, tiers, m.config, *m.weights, pol, trace ? &*trace : nullptr);

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
      const std::size_t i = todo[t];
      const auto& new_tokens = r.tokens[t - first];
      std::string text;
      if (m.tokenizer) {
        std::vector<std::int32_t> all = items[i].tokens;
        const std::size_t prompt_bytes = m.tokenizer->decode(all).size();
        all.insert(all.end(), new_tokens.begin(), new_tokens.end());
        text = m.tokenizer->decode(all).substr(prompt_bytes);
      }
      if (out) {
        out->add(items[i].id_json, text, new_tokens);
      } else if (m.tokenizer) {
        fmt::print("{}{}\n", items[i].text.value_or(""), text);
      } else {
        fmt::print("[{}]\n", fmt::join(new_tokens, ", "));
      }
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
                          {"compress_bits", pol.compress_bits}}},
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
    offload::write_file_atomically(o.metrics_file, j.dump(2) + "\n");
  }
  if (!o.trace_file.empty()) trace->write_chrome_json(o.trace_file);
  return stopped ? 130 : 0;
}

}  // namespace flexh2o::cli
