#include "engine/model/step.h"

#include <algorithm>
#include <stdexcept>

namespace flexh2o::engine {

namespace {
void begin_sequence(StepBatch& s, SeqStep kind) {
  if (s.seq_offsets.empty()) s.seq_offsets.push_back(0);
  s.kinds.push_back(kind);
  s.prefix_group.push_back(-1);
  s.prefix_len.push_back(0);
  s.pool_row.push_back(-1);
  s.base.push_back(0);
  s.prefill = s.prefill && kind == SeqStep::Prefill;
}
}  // namespace

namespace {
// Rows for tokens[from, end) at positions (and cache slots) from, from + 1, ...
void add_rows(StepBatch& s, std::span<const std::int32_t> tokens, std::int64_t from) {
  const auto b = static_cast<std::int64_t>(s.lens.size());
  for (auto i = static_cast<std::size_t>(from); i < tokens.size(); ++i) {
    s.token_ids.push_back(tokens[i]);
    s.positions.push_back(static_cast<std::int32_t>(i));
    s.row_seq.push_back(b);
    s.row_slot.push_back(static_cast<std::int64_t>(i));
  }
  s.seq_offsets.push_back(s.rows());
  s.lens.push_back(static_cast<std::int64_t>(tokens.size()));
  s.last_rows.push_back(s.rows() - 1);
}
}  // namespace

void StepBatch::add_prefill(std::span<const std::int32_t> tokens) {
  begin_sequence(*this, SeqStep::Prefill);
  add_rows(*this, tokens, 0);
}

void StepBatch::add_extend(std::span<const std::int32_t> tokens, std::int64_t cached) {
  if (cached <= 0 || cached >= static_cast<std::int64_t>(tokens.size()))
    throw std::logic_error("an extend step needs cached tokens and at least one to compute");
  begin_sequence(*this, SeqStep::Extend);
  add_rows(*this, tokens, cached);
}

void StepBatch::add_decode(std::int32_t token, std::int64_t cached) {
  begin_sequence(*this, SeqStep::Decode);
  token_ids.push_back(token);
  positions.push_back(static_cast<std::int32_t>(cached));
  row_seq.push_back(static_cast<std::int64_t>(lens.size()));
  row_slot.push_back(cached);
  seq_offsets.push_back(rows());
  lens.push_back(cached + 1);
  last_rows.push_back(rows() - 1);
}

std::int64_t StepBatch::predicting() const {
  return static_cast<std::int64_t>(std::ranges::count_if(kinds, [](SeqStep k) { return k != SeqStep::Idle; }));
}

void StepBatch::add_idle() {
  begin_sequence(*this, SeqStep::Idle);
  seq_offsets.push_back(rows());
  lens.push_back(0);
  last_rows.push_back(0);
}

void StepBatch::share_prefix(std::int64_t b, std::int64_t group, std::int64_t len) {
  const SeqStep kind = kinds.at(static_cast<std::size_t>(b));
  if ((kind != SeqStep::Decode && kind != SeqStep::Extend) || group < 0 || len < 0 || len > cached(b))
    throw std::logic_error("a shared prefix is read by a decode or extend sequence from the slots it holds");
  prefix_group[static_cast<std::size_t>(b)] = group;
  prefix_len[static_cast<std::size_t>(b)] = len;
}

void StepBatch::hold_prefix(std::int64_t b, std::int64_t row, std::int64_t base_tokens) {
  const auto i = static_cast<std::size_t>(b);
  if (kinds.at(i) == SeqStep::Idle || row < 0 || base_tokens <= 0 || base_tokens > lens[i] - 1 ||
      (kinds[i] != SeqStep::Prefill && base_tokens > cached(b)))
    throw std::logic_error("a held prefix is some of a sequence's tokens before its last, cached unless it prefills");
  pool_row[i] = row;
  base[i] = base_tokens;
  for (std::int64_t r = first_row(b); r < seq_offsets[i + 1]; ++r)
    if (positions[static_cast<std::size_t>(r)] >= base_tokens) row_slot[static_cast<std::size_t>(r)] -= base_tokens;
}

bool StepBatch::any_cached() const {
  for (std::int64_t b = 0; b < batch(); ++b)
    if (cached(b) > 0) return true;
  return false;
}

StepBatch StepBatch::make_prefill(std::span<const std::vector<std::int32_t>> prompts) {
  StepBatch s;
  for (const auto& p : prompts) s.add_prefill(p);
  if (s.seq_offsets.empty()) s.seq_offsets.push_back(0);
  return s;
}

StepBatch StepBatch::make_decode(std::span<const std::int32_t> tokens, std::span<const std::int64_t> lens) {
  StepBatch s;
  s.prefill = false;
  for (std::size_t b = 0; b < tokens.size(); ++b) s.add_decode(tokens[b], lens[b]);
  if (s.seq_offsets.empty()) s.seq_offsets.push_back(0);
  return s;
}

StepBatch StepBatch::slice(std::int64_t b0, std::int64_t b1) const {
  StepBatch s;
  const std::int64_t r0 = first_row(b0), r1 = first_row(b1);
  s.token_ids.assign(token_ids.begin() + r0, token_ids.begin() + r1);
  s.positions.assign(positions.begin() + r0, positions.begin() + r1);
  s.row_slot.assign(row_slot.begin() + r0, row_slot.begin() + r1);
  for (std::int64_t r = r0; r < r1; ++r) s.row_seq.push_back(row_seq[r] - b0);
  for (std::int64_t b = b0; b <= b1; ++b) s.seq_offsets.push_back(seq_offsets[b] - r0);
  s.lens.assign(lens.begin() + b0, lens.begin() + b1);
  s.kinds.assign(kinds.begin() + b0, kinds.begin() + b1);
  s.prefix_group.assign(prefix_group.begin() + b0, prefix_group.begin() + b1);
  s.prefix_len.assign(prefix_len.begin() + b0, prefix_len.begin() + b1);
  s.pool_row.assign(pool_row.begin() + b0, pool_row.begin() + b1);
  s.base.assign(base.begin() + b0, base.begin() + b1);
  s.prefill = std::ranges::all_of(s.kinds, [](SeqStep k) { return k == SeqStep::Prefill; });
  for (std::int64_t b = b0; b < b1; ++b) s.last_rows.push_back(std::max<std::int64_t>(last_rows[b] - r0, 0));
  return s;
}

}  // namespace flexh2o::engine
