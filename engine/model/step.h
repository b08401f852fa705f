// What one forward step of one batch looks like: which rows belong to which sequence,
// their positions, and where their keys and values go in the cache. Under continuous
// batching a step mixes kinds: some sequences prefill a whole prompt (a newcomer in a freed
// slot) or the rest of it after a shared prefix already in their cache row (docs/prefix-sharing.md)
// while the others decode one token, and a slot left without a request is idle (no rows); the
// layers run every row through the same projections and pick the attention kernel per run of
// sequences of one kind.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace flexh2o::engine {

enum class SeqStep : std::uint8_t {
  Prefill,  // all its tokens so far into an empty cache row
  Decode,   // one new token after lens - 1 cached ones
  Extend,   // the rest of a prompt after cached() slots already in its cache row
  Idle,     // a slot without a sequence: no rows, nothing cached
};

struct StepBatch {
  bool prefill = true;  // every sequence prefills (kinds all Prefill)
  std::vector<std::int32_t> token_ids;    // [rows]
  std::vector<std::int32_t> positions;    // [rows]
  std::vector<std::int64_t> row_seq;      // [rows] sequence of each row
  std::vector<std::int64_t> row_slot;     // [rows] cache slot each row's K/V is written to
  std::vector<std::int64_t> seq_offsets;  // [B + 1] row ranges of the sequences
  std::vector<std::int64_t> lens;         // [B] valid cache slots after this step (0 when idle)
  std::vector<std::int64_t> last_rows;    // [B] the row whose logits predict the next token (0 when idle)
  std::vector<SeqStep> kinds;             // [B]
  // [B] Shared prefixes (cascade attention, docs/prefix-sharing.md): the sequences of one
  // prefix_group id (>= 0) hold the same KV bytes in the first prefix_len slots of their cache
  // rows (copies of one computation, none rewritten since), at most the slots each held before
  // the step; -1 and 0: none.
  std::vector<std::int64_t> prefix_group, prefix_len;
  // [B] Prefixes held once (docs/prefix-sharing.md, "Holding a prefix once"): the pool row
  // holding a sequence's first `base` tokens (-1: none, base 0); its own cache row then holds
  // positions from base on, at slots position - base (row_slot). A prefill's rows before base
  // go to the pool row (row_slot: their position there).
  std::vector<std::int64_t> pool_row, base;

  std::int64_t rows() const { return static_cast<std::int64_t>(token_ids.size()); }
  std::int64_t batch() const { return static_cast<std::int64_t>(lens.size()); }
  // The sequences that predict a next token (every one but the idle slots): the head's rows.
  std::int64_t predicting() const;

  // The first row of sequence b.
  std::int64_t first_row(std::int64_t b) const { return seq_offsets[b]; }
  // Sequences [b0, b1) as a batch of their own (rows, offsets and sequence indices rebased).
  StepBatch slice(std::int64_t b0, std::int64_t b1) const;
  // The rows of sequence b, and the slots its cache held before this step (lens[b] less them).
  std::int64_t seq_rows(std::int64_t b) const { return seq_offsets[b + 1] - seq_offsets[b]; }
  std::int64_t cached(std::int64_t b) const { return lens[b] - seq_rows(b); }
  // Whether some sequence reads tokens cached by earlier steps (it decodes or extends).
  bool any_cached() const;

  // Appends a sequence: its whole `tokens` prefilled, one token decoded after `cached` ones,
  // tokens[cached, end) after the `cached` first ones in its cache row, or an idle slot.
  void add_prefill(std::span<const std::int32_t> tokens);
  void add_decode(std::int32_t token, std::int64_t cached);
  void add_extend(std::span<const std::int32_t> tokens, std::int64_t cached);
  void add_idle();
  // Sequence b (a decode or extend) joins shared prefix `group` of `len` slots.
  void share_prefix(std::int64_t b, std::int64_t group, std::int64_t len);
  // Sequence b's first `base` tokens are held in pool row `row` (a prefill writes them there).
  void hold_prefix(std::int64_t b, std::int64_t row, std::int64_t base);
  // Whether row r's K/V go to its sequence's pool row (a prefill's rows before its base).
  bool writes_pool(std::int64_t r) const {
    const auto b = static_cast<std::size_t>(row_seq[static_cast<std::size_t>(r)]);
    return pool_row[b] >= 0 && positions[static_cast<std::size_t>(r)] < base[b];
  }

  // Prefill of whole prompts into an empty cache.
  static StepBatch make_prefill(std::span<const std::vector<std::int32_t>> prompts);
  // One new token per sequence; `lens` are the cache lengths before the step.
  static StepBatch make_decode(std::span<const std::int32_t> tokens, std::span<const std::int64_t> lens);
};

}  // namespace flexh2o::engine
