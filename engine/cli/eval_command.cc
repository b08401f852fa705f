#include "engine/cli/eval_command.h"

#include <fmt/format.h>

#include <sstream>
#include <stdexcept>

#include "offload/text_file.h"

namespace flexh2o::cli {

CLI::App* add_eval_command(CLI::App& app, EvalCliOptions& o) {
  auto* eval = app.add_subcommand(
      "eval", "Quality of KV eviction policies and compression against the full, uncompressed model (teacher-forced)");
  eval->add_option("--model", o.eval.model, "as for run (default: the embedded stories260K)");
  eval->add_option("--tokenizer", o.eval.tokenizer, "as for run");
  eval->add_flag("--dummy", o.eval.dummy, "random weights of the model's shape (the model's tokenizer still reads the text)");
  eval->add_option("--text", o.text_file, "text file; its blank-line-separated paragraphs are the chunks")->required();
  eval->add_option("--kv", o.eval.kv, "comma-separated KV policy specs, e.g. full,local:0.2,h2o:0.2 (full is the reference)");
  eval->add_option("--compress", o.compress,
                   "comma list of none, cache, weight, both: each KV policy is evaluated under each (default none)");
  eval->add_option("--compress-bits", o.eval.compress_bits, "bits per value when compressing: 4 or 8")
      ->check(CLI::IsMember({4, 8}));
  eval->add_option("--compute-dtype", o.compute_dtypes,
                   "comma list of f32, bf16: how projections multiply (the reference is always f32)");
  eval->add_option("--backend", o.eval.backend, "compute backend: auto, cpu or cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  eval->add_option("--chunks", o.eval.chunks, "evaluate the first N paragraphs")->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 30));
  eval->add_option("--skip", o.eval.skip, "skip the first N paragraphs (held-out chunks: tune on the first, report on the rest)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 30));
  eval->add_option("--prefill", o.eval.prefill,
                   "the first F of each chunk (a fraction like 0.5, or a token count) is the prompt, prefilled with "
                   "the policy's prefill rule; the rest is teacher-forced decode and only it is scored (default 1: "
                   "BOS only, every token decoded)");
  eval->add_option("--batch", o.eval.batch, "chunks per batch")->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 16));
  eval->add_option("--csv", o.csv_file, "also write the table as CSV");
  return eval;
}

namespace {

// The --compress list: none, cache, weight or both.
std::vector<std::string> compress_modes(const EvalCliOptions& o) {
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
std::vector<kernels::DType> compute_dtypes(const EvalCliOptions& o) {
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
void print_results(const EvalCliOptions& o, const job::EvalResults& r) {
  const engine::PromptSplit& split = r.split;
  const std::vector<engine::KvQuality>& results = r.results;
  const std::string protocol =
      split.fraction ? fmt::format("first {} of each chunk prefilled", *split.fraction)
                     : (split.tokens == 1 ? std::string("decode only") : fmt::format("first {} tokens of each chunk prefilled", split.tokens));
  fmt::print("model: {} | text: {} | {} chunks (skipped {}), {}, {} predicted tokens\n\n", r.model, o.text_file,
             r.chunks, o.eval.skip, protocol, results.front().tokens);
  fmt::print("| kv policy | mean NLL | perplexity | top-1 agreement | mean KL(full \\|\\| policy) |\n|---|---|---|---|---|\n");
  for (const auto& q : results)
    fmt::print("| {} | {:.4f} | {:.3f} | {:.4f} | {:.5f} |\n", q.label, q.mean_nll, q.perplexity, q.top1_agreement,
               q.mean_kl);
  if (!o.csv_file.empty()) {
    std::string csv = "policy,tokens,mean_nll,perplexity,top1_agreement,mean_kl\n";
    for (const auto& q : results)
      csv += fmt::format("\"{}\",{},{},{},{},{}\n", q.label, q.tokens, q.mean_nll, q.perplexity, q.top1_agreement,
                         q.mean_kl);
    offload::write_file_atomically(o.csv_file, csv);
  }
}

}  // namespace

int eval_command(const EvalCliOptions& o) {
  job::EvalOptions e = o.eval;
  e.compress_modes = compress_modes(o);
  e.compute_dtypes = compute_dtypes(o);
  const auto text = offload::read_text_file(o.text_file, offload::kMaxInputFileBytes);
  if (!text) throw std::invalid_argument("cannot read --text file " + o.text_file);
  e.text = *text;
  e.text_name = o.text_file;
  print_results(o, job::evaluate(e));
  return 0;
}

}  // namespace flexh2o::cli
