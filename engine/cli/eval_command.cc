#include "engine/cli/eval_command.h"

#include <fmt/format.h>


#include <algorithm>
#include <map>
#include <memory>
#include <sstream>

#include "engine/runtime/kv_quality.h"
#include "engine/loaders/model_source.h"
#include "engine/serving/prompts.h"
#include "offload/text_file.h"

namespace flexh2o::cli {

using namespace flexh2o::engine;

CLI::App* add_eval_command(CLI::App& app, EvalOptions& o) {
  auto* eval = app.add_subcommand(
      "eval", "Quality of KV eviction policies and compression against the full, uncompressed model (teacher-forced)");
  eval->add_option("--model", o.model, "as for run (default: the embedded stories260K)");
  eval->add_option("--tokenizer", o.tokenizer, "as for run");
  eval->add_flag("--dummy", o.dummy, "random weights of the model's shape (the model's tokenizer still reads the text)");
  eval->add_option("--text", o.text_file, "text file; its blank-line-separated paragraphs are the chunks")->required();
  eval->add_option("--kv", o.kv, "comma-separated KV policy specs, e.g. full,local:0.2,h2o:0.2 (full is the reference)");
  eval->add_option("--compress", o.compress,
                   "comma list of none, cache, weight, both: each KV policy is evaluated under each (default none)");
  eval->add_option("--compress-bits", o.compress_bits, "bits per value when compressing: 4 or 8")
      ->check(CLI::IsMember({4, 8}));
  eval->add_option("--compute-dtype", o.compute_dtypes,
                   "comma list of f32, bf16: how projections multiply (the reference is always f32)");
  eval->add_option("--backend", o.backend, "compute backend: auto, cpu or cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  eval->add_option("--chunks", o.chunks, "evaluate the first N paragraphs")->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 30));
  eval->add_option("--skip", o.skip, "skip the first N paragraphs (held-out chunks: tune on the first, report on the rest)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 30));
  eval->add_option("--prefill", o.prefill,
                   "the first F of each chunk (a fraction like 0.5, or a token count) is the prompt, prefilled with "
                   "the policy's prefill rule; the rest is teacher-forced decode and only it is scored (default 1: "
                   "BOS only, every token decoded)");
  eval->add_option("--batch", o.batch, "chunks per batch")->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 16));
  eval->add_option("--csv", o.csv_file, "also write the table as CSV");
  return eval;
}

namespace {

// The text's paragraphs after --skip, tokenized, at most --chunks of them (each of at least 2
// tokens, cut to the model's positions).
std::vector<std::vector<std::int32_t>> text_chunks(const EvalOptions& o, const ModelSource& m, const std::string& text) {
  std::vector<std::vector<std::int32_t>> chunks;
  const auto paragraphs = split_paragraphs(text);
  for (std::size_t i = static_cast<std::size_t>(std::min<std::int64_t>(o.skip, static_cast<std::int64_t>(paragraphs.size())));
       i < paragraphs.size(); ++i) {
    const std::string& para = paragraphs[i];
    if (static_cast<std::int64_t>(chunks.size()) >= o.chunks) break;
    std::vector<std::int32_t> ids = encode_prompt(*m.tokenizer, para, m.config.bos_id);
    if (static_cast<std::int64_t>(ids.size()) > m.config.position_limit())
      ids.resize(static_cast<std::size_t>(m.config.position_limit()));
    if (ids.size() >= 2) chunks.push_back(std::move(ids));
  }
  if (chunks.empty())
    throw std::invalid_argument(o.text_file + ": no paragraph of at least 2 tokens" +
                                (o.skip > 0 ? " after skipping " + std::to_string(o.skip) : std::string()));
  return chunks;
}

// The --compress list: none, cache, weight or both.
std::vector<std::string> compress_modes(const EvalOptions& o) {
  std::vector<std::string> modes;
  std::stringstream list(o.compress);
  for (std::string spec; std::getline(list, spec, ',');) {
    if (spec != "none" && spec != "cache" && spec != "weight" && spec != "both")
      throw std::invalid_argument("--compress: unknown mode '" + spec + "' (expected none, cache, weight or both)");
    modes.push_back(spec);
  }
  if (modes.empty()) throw std::invalid_argument("--compress: give at least one of none, cache, weight, both");
  return modes;
}

// The --compute-dtype list: f32, bf16 or both.
std::vector<kernels::DType> compute_dtypes(const EvalOptions& o) {
  std::vector<kernels::DType> computes;
  std::stringstream compute_list(o.compute_dtypes);
  for (std::string c; std::getline(compute_list, c, ',');) {
    if (c != "f32" && c != "bf16") throw std::invalid_argument("--compute-dtype: unknown '" + c + "' (expected f32 or bf16)");
    computes.push_back(kernels::parse_dtype(c));
  }
  if (computes.empty()) throw std::invalid_argument("--compute-dtype: give f32, bf16 or both");
  return computes;
}

// The table of every variant's scores, on stdout and in --csv.
void print_results(const EvalOptions& o, const ModelSource& m, std::size_t chunks, const PromptSplit& split,
                   const std::vector<KvQuality>& results) {
  const std::string protocol =
      split.fraction ? fmt::format("first {} of each chunk prefilled", *split.fraction)
                     : (split.tokens == 1 ? std::string("decode only") : fmt::format("first {} tokens of each chunk prefilled", split.tokens));
  fmt::print("model: {} | text: {} | {} chunks (skipped {}), {}, {} predicted tokens\n\n", m.description, o.text_file,
             chunks, o.skip, protocol, results.front().tokens);
  fmt::print("| kv policy | mean NLL | perplexity | top-1 agreement | mean KL(full \\|\\| policy) |\n|---|---|---|---|---|\n");
  for (const auto& r : results)
    fmt::print("| {} | {:.4f} | {:.3f} | {:.4f} | {:.5f} |\n", r.label, r.mean_nll, r.perplexity, r.top1_agreement,
               r.mean_kl);
  if (!o.csv_file.empty()) {
    std::string csv = "policy,tokens,mean_nll,perplexity,top1_agreement,mean_kl\n";
    for (const auto& r : results)
      csv += fmt::format("\"{}\",{},{},{},{},{}\n", r.label, r.tokens, r.mean_nll, r.perplexity, r.top1_agreement,
                         r.mean_kl);
    offload::write_file_atomically(o.csv_file, csv);
  }
}

}  // namespace

int eval_command(const EvalOptions& o) {
  const std::vector<policy::KvSpec> specs = policy::parse_kv_specs(o.kv);
  const PromptSplit split = parse_prompt_split(o.prefill);
  ModelOptions mo;
  mo.model = o.model;
  mo.tokenizer = o.tokenizer;
  mo.dummy = o.dummy;
  ModelSource m = open_model(mo);
  if (!m.tokenizer) throw std::invalid_argument("eval needs a tokenizer for the text; pass --tokenizer");
  const auto text = offload::read_text_file(o.text_file, offload::kMaxInputFileBytes);
  if (!text) throw std::invalid_argument("cannot read --text file " + o.text_file);
  const std::vector<std::vector<std::int32_t>> chunks = text_chunks(o, m, *text);
  // One generator per (weights, cache) storage the --compress list asks for.
  const kernels::DType q = o.compress_bits == 8 ? kernels::DType::Q8 : kernels::DType::Q4;
  const std::vector<std::string> modes = compress_modes(o);
  auto be = kernels::make_backend(o.backend);
  const HostWeights weights = load_weights(m.config, *m.weights);
  Generator reference(*be, m.config, weights);
  const bool any_weight = std::ranges::any_of(modes, [](const auto& s) { return s == "weight" || s == "both"; });
  const HostWeights qweights = any_weight ? load_weights(with_weight_dtype(m.config, q), *m.weights) : HostWeights{};
  const std::vector<kernels::DType> computes = compute_dtypes(o);
  std::map<std::pair<std::string, kernels::DType>, std::unique_ptr<Generator>> generators;
  std::vector<EvalVariant> variants;
  for (const auto& spec : specs)
    for (const auto compute : computes)
    for (const auto& mode : modes) {
      const bool cw = mode == "weight" || mode == "both", cc = mode == "cache" || mode == "both";
      const bool plain = mode == "none" && compute == kernels::DType::F32;
      auto& g = generators[{mode, compute}];
      if (!g && !plain) {
        ModelConfig c = cw ? with_weight_dtype(m.config, q) : m.config;
        c.compute_dtype = compute;
        g = std::make_unique<Generator>(*be, c, cw ? qweights : weights, cc ? q : kernels::DType::F32);
      }
      std::string suffix = mode == "none" ? "" : fmt::format(" + {}-bit {}", o.compress_bits, mode);
      if (compute != kernels::DType::F32) suffix += " + bf16 compute";
      variants.push_back({spec.text + suffix, spec, plain ? &reference : g.get()});
    }
  const auto results = evaluate_variants(reference, chunks, variants, o.batch, split);

  print_results(o, m, chunks.size(), split, results);
  return 0;
}

}  // namespace flexh2o::cli
