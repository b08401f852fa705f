#include "engine/step.h"

namespace flexh2o::engine {

StepBatch StepBatch::make_prefill(std::span<const std::vector<std::int32_t>> prompts) {
  StepBatch s;
  s.prefill = true;
  s.seq_offsets.push_back(0);
  for (std::size_t b = 0; b < prompts.size(); ++b) {
    const auto& p = prompts[b];
    for (std::size_t i = 0; i < p.size(); ++i) {
      s.token_ids.push_back(p[i]);
      s.positions.push_back(static_cast<std::int32_t>(i));
      s.row_seq.push_back(static_cast<std::int64_t>(b));
      s.row_slot.push_back(static_cast<std::int64_t>(i));
    }
    s.seq_offsets.push_back(s.rows());
    s.lens.push_back(static_cast<std::int64_t>(p.size()));
    s.last_rows.push_back(s.rows() - 1);
  }
  return s;
}

StepBatch StepBatch::make_decode(std::span<const std::int32_t> tokens, std::span<const std::int64_t> lens) {
  StepBatch s;
  s.prefill = false;
  for (std::size_t b = 0; b < tokens.size(); ++b) {
    s.token_ids.push_back(tokens[b]);
    s.positions.push_back(static_cast<std::int32_t>(lens[b]));
    s.row_seq.push_back(static_cast<std::int64_t>(b));
    s.row_slot.push_back(lens[b]);
    s.lens.push_back(lens[b] + 1);
    s.last_rows.push_back(static_cast<std::int64_t>(b));
  }
  return s;
}

}  // namespace flexh2o::engine
