// Quality of KV eviction policies against the full cache (ALGORITHMS.md section 5's protocol):
// each chunk is processed one token at a time as in decode (BOS as the prompt, the rest
// teacher-forced), with eviction active; every predicted token contributes its NLL under the
// policy, whether the policy's argmax equals the full cache's, and KL(full || policy).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/generator.h"
#include "policy/eviction/kv_spec.h"

namespace flexh2o::engine {

struct KvQuality {
  policy::KvSpec spec;
  std::int64_t tokens = 0;  // predicted tokens
  double mean_nll = 0, perplexity = 0, top1_agreement = 0, mean_kl = 0;
};

// Blank-line-separated paragraphs, trimmed; empty ones dropped.
std::vector<std::string> split_paragraphs(std::string_view text);

// chunks: token ids, each at least 2 long (BOS first). Runs `batch` chunks at a time, the
// full cache first, then each policy on the same chunks.
std::vector<KvQuality> evaluate_kv_policies(Generator& gen, const std::vector<std::vector<std::int32_t>>& chunks,
                                            const std::vector<policy::KvSpec>& specs, std::int64_t batch);

}  // namespace flexh2o::engine
