// Quality of KV eviction policies and compression against the full, uncompressed model
// (ALGORITHMS.md section 5's protocol): each chunk is processed one token at a time as in
// decode (BOS as the prompt, the rest teacher-forced), with eviction active; every predicted
// token contributes its NLL under the variant, whether the variant's argmax equals the
// reference's, and KL(reference || variant).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/generator.h"
#include "policy/eviction/kv_spec.h"

namespace flexh2o::engine {

struct KvQuality {
  std::string label;
  policy::KvSpec spec;
  std::int64_t tokens = 0;  // predicted tokens
  double mean_nll = 0, perplexity = 0, top1_agreement = 0, mean_kl = 0;
};

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
// cache on `reference` first, then each variant on the same chunks.
std::vector<KvQuality> evaluate_variants(Generator& reference, const std::vector<std::vector<std::int32_t>>& chunks,
                                         const std::vector<EvalVariant>& variants, std::int64_t batch);

}  // namespace flexh2o::engine
