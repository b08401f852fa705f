// What one forward step of one batch looks like: which rows belong to which sequence,
// their positions, and where their keys and values go in the cache.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace flexh2o::engine {

struct StepBatch {
  bool prefill = true;
  std::vector<std::int32_t> token_ids;    // [rows]
  std::vector<std::int32_t> positions;    // [rows]
  std::vector<std::int64_t> row_seq;      // [rows] sequence of each row
  std::vector<std::int64_t> row_slot;     // [rows] cache slot each row's K/V is written to
  std::vector<std::int64_t> seq_offsets;  // prefill: [B + 1] row ranges of the sequences
  std::vector<std::int64_t> lens;         // [B] valid cache slots after this step
  std::vector<std::int64_t> last_rows;    // [B] the row whose logits predict the next token

  std::int64_t rows() const { return static_cast<std::int64_t>(token_ids.size()); }
  std::int64_t batch() const { return static_cast<std::int64_t>(lens.size()); }

  // The first row of sequence b.
  std::int64_t first_row(std::int64_t b) const { return prefill ? seq_offsets[b] : b; }
  // Sequences [b0, b1) as a batch of their own (rows, offsets and sequence indices rebased).
  StepBatch slice(std::int64_t b0, std::int64_t b1) const;

  // Prefill of whole prompts into an empty cache.
  static StepBatch make_prefill(std::span<const std::vector<std::int32_t>> prompts);
  // One new token per sequence; `lens` are the cache lengths before the step.
  static StepBatch make_decode(std::span<const std::int32_t> tokens, std::span<const std::int64_t> lens);
};

}  // namespace flexh2o::engine
