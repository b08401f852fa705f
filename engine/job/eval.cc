#include "engine/job/eval.h"

#include <fmt/format.h>


#include <algorithm>
#include <map>
#include <memory>
#include <sstream>

#include "engine/runtime/kv_quality.h"
#include "engine/loaders/model_source.h"
#include "engine/serving/prompts.h"
#include "kernels/option_error.h"

namespace flexh2o::job {

using namespace flexh2o::engine;

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
    throw std::invalid_argument(o.text_name + ": no paragraph of at least 2 tokens" +
                                (o.skip > 0 ? " after skipping " + std::to_string(o.skip) : std::string()));
  return chunks;
}

}  // namespace

EvalResults evaluate(const EvalOptions& o) {
  const std::vector<policy::KvSpec> specs = policy::parse_kv_specs(o.kv);
  const PromptSplit split = parse_prompt_split(o.prefill);
  ModelOptions mo;
  mo.model = o.model;
  mo.tokenizer = o.tokenizer;
  mo.dummy = o.dummy;
  ModelSource m = open_model(mo);
  if (!m.tokenizer)
    throw kernels::OptionError{"an evaluation needs a tokenizer for the text; pass ", kernels::Option::Tokenizer};
  const std::vector<std::vector<std::int32_t>> chunks = text_chunks(o, m, o.text);
  // One generator per (weights, cache) storage the --compress list asks for.
  const kernels::DType q = o.compress_bits == 8 ? kernels::DType::Q8 : kernels::DType::Q4;
  const std::vector<std::string>& modes = o.compress_modes;
  auto be = kernels::make_backend(o.backend);
  const HostWeights weights = load_weights(m.config, *m.weights);
  Generator reference(*be, m.config, weights);
  const bool any_weight = std::ranges::any_of(modes, [](const auto& s) { return s == "weight" || s == "both"; });
  const HostWeights qweights = any_weight ? load_weights(with_weight_dtype(m.config, q), *m.weights) : HostWeights{};
  const std::vector<kernels::DType>& computes = o.compute_dtypes;
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
  return {.model = m.description,
          .chunks = chunks.size(),
          .split = split,
          .results = evaluate_variants(reference, chunks, variants, o.batch, split)};
}

}  // namespace flexh2o::job
