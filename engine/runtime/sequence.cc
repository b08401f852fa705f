#include "engine/runtime/sequence.h"

#include <utility>

namespace flexh2o::engine {

std::vector<Sequence> sequences_of(std::vector<std::vector<std::int32_t>> prompts) {
  std::vector<Sequence> out(prompts.size());
  for (std::size_t i = 0; i < prompts.size(); ++i) out[i].prompt = std::move(prompts[i]);
  return out;
}

std::vector<std::vector<std::int32_t>> prompts_of(std::span<const Sequence> sequences) {
  std::vector<std::vector<std::int32_t>> out;
  out.reserve(sequences.size());
  for (const Sequence& s : sequences) out.push_back(s.prompt);
  return out;
}

}  // namespace flexh2o::engine
