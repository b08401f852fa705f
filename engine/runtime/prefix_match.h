// Shared prompt prefixes (docs/prefix-sharing.md): which slot's cache row holds the longest
// prefix of a new prompt. A row's slots [0, n) hold the KV of the first n tokens it computed
// (or took), at their positions, exactly as the new prompt's own prefill would compute them
// when the attention is causal and positions do not depend on the sequence's length. The rows
// are at most a block's slots, so each match is a scan that stops at the first token that
// differs.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/model/model_config.h"
#include "policy/cost_model.h"

namespace flexh2o::engine {

// Tokens at the start of both.
std::int64_t common_prefix(std::span<const std::int32_t> a, std::span<const std::int32_t> b);

struct PrefixMatch {
  std::int64_t slot = -1;  // the row holding it (-1: none)
  std::int64_t tokens = 0;
};

// The row of `held` (per slot, the tokens its cache row holds) with the longest common prefix
// with `prompt`, at most prompt.size() - 1 tokens (the last prompt token is computed for its
// logits) and at least `min_tokens`, else none. Ties go to `prefer` (the slot the prompt goes
// to: nothing to copy), then to the lowest slot.
PrefixMatch longest_prefix(std::span<const std::int32_t> prompt, std::span<const std::span<const std::int32_t>> held,
                           std::int64_t prefer, std::int64_t min_tokens);

// Prefixes held once (docs/prefix-sharing.md, "Holding a prefix once"): a job's prompts in
// families, each member starting with its family's prefix, which is computed and stored once
// and read by every member, whose own cache row then starts after it.
struct PrefixFamilies {
  std::vector<std::int64_t> family_of;  // per prompt: its family, -1: none
  std::vector<std::int64_t> prefix;     // per family: its prefix's tokens (at least min_tokens)
};

// Families of `prompts`: in lexicographic order, runs of prompts each sharing at least
// min_tokens tokens with the next (at most each one's length less one: its last token is
// computed for its logits). A run's prefix is the tokens all its members share; where the run's
// weakest links cut it into runs of longer prefixes that save more prompt tokens in all
// ((members - 1) x prefix), it is cut there (a prompt left alone joins no family).
PrefixFamilies prefix_families(std::span<const std::span<const std::int32_t>> prompts, std::int64_t min_tokens);

// The pool that holds `families` once for the job's requests (requests[b]: prompt b's, its
// prompt and new tokens): rows of the longest family prefix, and the most tokens a request
// holds after its family's prefix.
policy::HeldPrefixes held_prefixes(const PrefixFamilies& families, std::span<const policy::RequestLength> requests);

// The job's requests (requests[b]: prompt b's) as the planner counts them under `families`:
// each in its family (RequestLength::family), sharing its prefix (RequestLength::shared) where
// a row holds it when it is admitted.
void add_families(const PrefixFamilies& families, std::span<policy::RequestLength> requests);

// Why a prefix's KV computed in one sequence is not the KV another sequence would compute for
// it, so sharing is off: a KV eviction policy (a row keeps the slots its policy chose for its
// own tokens) or RoPE frequencies that follow the sequence's length; "" when sharing applies.
std::string prefix_sharing_off_reason(const ModelConfig& cfg, bool evicting);

}  // namespace flexh2o::engine
