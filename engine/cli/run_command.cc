#include "engine/cli/run_command.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <random>

#include "engine/generator.h"
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
  run->add_option("--batch", o.batch, "sequences per batch")->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  run->add_option("--prompt-len", o.prompt_len, "length of synthetic random prompts")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  run->add_option("--temperature", o.temperature, "0 = greedy")->check(CLI::Range(0.0f, 100.0f));
  run->add_option("--top-p", o.top_p, "nucleus sampling mass")->check(CLI::Range(0.0f, 1.0f));
  run->add_option("--seed", o.seed, "seed of sampling and dummy weights");
  run->add_flag("--dummy", o.dummy, "random weights of the model's shape (no checkpoint needed)");
  run->add_option("--dtype", o.dtype, "storage dtype of weight matrices: f32, f16 or bf16")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
  return run;
}

namespace {

std::vector<PromptItem> gather_prompts(const RunOptions& o, const ModelSource& m) {
  std::vector<PromptItem> items;
  if (!o.prompts_file.empty()) {
    items = read_prompts_jsonl(o.prompts_file);
    if (items.empty()) throw std::runtime_error(o.prompts_file + ": no prompts in the file");
  } else if (!o.prompt.empty() || m.tokenizer) {
    // A text prompt (empty: start from BOS), repeated to fill one batch.
    for (std::int64_t i = 0; i < o.batch; ++i) items.push_back({std::to_string(i), o.prompt, {}});
  } else {
    // No tokenizer and no prompts: random token prompts, as FlexGen's synthetic benchmarks use.
    std::mt19937_64 rng(o.seed);
    std::uniform_int_distribution<std::int32_t> tok(0, static_cast<std::int32_t>(m.config.vocab_size - 1));
    for (std::int64_t i = 0; i < o.batch; ++i) {
      PromptItem it{std::to_string(i), std::nullopt, {}};
      for (std::int64_t t = 0; t < o.prompt_len; ++t) it.tokens.push_back(tok(rng));
      items.push_back(std::move(it));
    }
  }
  tokenize_prompts(items, m.tokenizer.get(), m.config.bos_id, m.config.name);
  return items;
}

}  // namespace

int run_command(const RunOptions& o) {
  ModelOptions mo;
  mo.model = o.model;
  mo.tokenizer = o.tokenizer;
  mo.dummy = o.dummy;
  mo.seed = o.seed;
  if (!o.dtype.empty()) mo.dtype = kernels::parse_dtype(o.dtype);
  ModelSource m = open_model(mo);
  const std::int64_t gen_len = o.gen_len.value_or(o.model.empty() ? 256 : 32);

  std::vector<PromptItem> items = gather_prompts(o, m);
  std::vector<std::vector<std::int32_t>> all_prompts;
  std::vector<std::string> ids;
  for (const auto& it : items) {
    all_prompts.push_back(it.tokens);
    ids.push_back("id " + it.id_json);
  }
  check_prompts(m.config, all_prompts, gen_len, ids);  // fail before loading weights

  auto backend = kernels::make_cpu_backend();
  const HostWeights weights = load_weights(m.config, *m.weights);
  Generator gen(*backend, m.config, weights);
  std::optional<JsonlWriter> out;
  if (!o.out_file.empty()) out.emplace(o.out_file);

  GenerationResult total;
  for (std::size_t first = 0; first < items.size(); first += static_cast<std::size_t>(o.batch)) {
    const std::size_t last = std::min(items.size(), first + static_cast<std::size_t>(o.batch));
    GenerationRequest req;
    req.max_new_tokens = gen_len;
    req.sampling = {o.temperature, o.top_p, o.seed};
    for (std::size_t i = first; i < last; ++i) {
      req.prompts.push_back(items[i].tokens);
      req.streams.push_back(i);
    }
    GenerationResult r = gen.generate(req);
    for (std::size_t i = first; i < last; ++i) {
      const auto& new_tokens = r.tokens[i - first];
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
    total.prefill_seconds += r.prefill_seconds;
    total.decode_seconds += r.decode_seconds;
    total.prompt_tokens += r.prompt_tokens;
    total.generated_tokens += r.generated_tokens;
  }
  std::fflush(stdout);
  const double all_s = total.prefill_seconds + total.decode_seconds;
  const std::int64_t decoded = total.generated_tokens - static_cast<std::int64_t>(items.size());
  fmt::print(stderr,
             "model: {} ({} layers, hidden {}, {} weights)\n"
             "prompts: {}, batch: {}, prompt tokens: {}, generated tokens: {}\n"
             "prefill: {:.3f} s, {:.1f} tok/s | decode: {:.3f} s, {:.1f} tok/s | total: {:.1f} tok/s\n",
             m.description, m.config.n_layers, m.config.hidden, kernels::dtype_name(m.config.dtype), items.size(),
             o.batch, total.prompt_tokens, total.generated_tokens, total.prefill_seconds,
             total.prompt_tokens / std::max(total.prefill_seconds, 1e-9), total.decode_seconds,
             decoded / std::max(total.decode_seconds, 1e-9), total.generated_tokens / std::max(all_s, 1e-9));
  return 0;
}

}  // namespace flexh2o::cli
