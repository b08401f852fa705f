#include "engine/model/step.h"

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

StepBatch StepBatch::slice(std::int64_t b0, std::int64_t b1) const {
  StepBatch s;
  s.prefill = prefill;
  const std::int64_t r0 = first_row(b0), r1 = b1 < batch() ? first_row(b1) : rows();
  s.token_ids.assign(token_ids.begin() + r0, token_ids.begin() + r1);
  s.positions.assign(positions.begin() + r0, positions.begin() + r1);
  s.row_slot.assign(row_slot.begin() + r0, row_slot.begin() + r1);
  for (std::int64_t r = r0; r < r1; ++r) s.row_seq.push_back(row_seq[r] - b0);
  if (prefill)
    for (std::int64_t b = b0; b <= b1; ++b) s.seq_offsets.push_back(seq_offsets[b] - r0);
  s.lens.assign(lens.begin() + b0, lens.begin() + b1);
  for (std::int64_t b = b0; b < b1; ++b) s.last_rows.push_back(last_rows[b] - r0);
  return s;
}

}  // namespace flexh2o::engine
