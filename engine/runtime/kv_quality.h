// Quality of KV eviction policies and compression against the full, uncompressed model
// (docs/kv-eviction.md, "The eval protocol"): each chunk is processed one token at a time as in
// decode (BOS as the prompt, the rest teacher-forced), with eviction active; every predicted
// token contributes its NLL under the variant, whether the variant's argmax equals the
// reference's, and KL(reference || variant). With a longer prompt (PromptSplit) the first
// tokens of each chunk go through prefill, where prefill-time policies (snapkv, pyramid, h2o's
// column sums) choose, and only the tokens after the prompt are predicted.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/runtime/generator.h"
#include "policy/eviction/kv_spec.h"

namespace flexh2o::engine {

struct KvQuality {
  std::string label;
  policy::KvSpec spec;
  std::int64_t tokens = 0;  // predicted tokens
  double mean_nll = 0, perplexity = 0, top1_agreement = 0, mean_kl = 0;
};

// How much of each chunk is the prompt: `tokens` (default 1: BOS only, the decode protocol) or,
// when set, `fraction` of the chunk's tokens. Always at least 1 and at most n - 1, so that at
// least one token is predicted.
struct PromptSplit {
  std::int64_t tokens = 1;
  std::optional<double> fraction;
  std::int64_t prompt_tokens(std::int64_t n) const;
};
// "0.5" (a fraction in (0, 1)) or "32" (a token count >= 1); throws std::invalid_argument.
PromptSplit parse_prompt_split(std::string_view text);

// Blank-line-separated paragraphs, trimmed; empty ones dropped.
std::vector<std::string> split_paragraphs(std::string_view text);

// One configuration under test: a KV policy on a generator, whose weights and cache dtype
// carry compress_weight / compress_cache.
struct EvalVariant {
  std::string label;
  policy::KvSpec kv;
  Generator* generator = nullptr;
};

// chunks: token ids, each at least 2 long (BOS first). Runs `batch` chunks at a time: the full
// cache on `reference` first, then each variant on the same chunks. The first
// split.prompt_tokens(n) tokens of a chunk are its prompt; the tokens after it are predicted
// (the first of them from the prefill's last position, the rest by teacher-forced decode).
std::vector<KvQuality> evaluate_variants(Generator& reference, const std::vector<std::vector<std::int32_t>>& chunks,
                                         const std::vector<EvalVariant>& variants, std::int64_t batch,
                                         const PromptSplit& split = {});

}  // namespace flexh2o::engine
