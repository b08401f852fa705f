// n samples of one prompt share one prefill (Sequence::shares_prompt). The scheduler
// admits such a run of sequences together: the first prefills the prompt in its slot while the
// others' slots sit idle for that step; each samples its first token from the same final
// prefill logits with its own sampling stream; after the step the prefilled slot is forked into
// the others: its KV rows in every decoder layer, wherever each slot lives (gpu, cpu or disk,
// compressed or not: the bytes move as stored), and the KV policy's state of every kv head.
// From there each sequence decodes on its own, with the tokens its own prefill would give.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "engine/runtime/cache_ring.h"
#include "engine/runtime/generator.h"
#include "offload/copy_engine.h"

namespace flexh2o::engine {

// Throws naming the prompt unless the first sequence shares no prompt and each one that shares
// has the prompt and new tokens limit of the one before it.
void check_shared_prompts(const GenerationRequest& req);

// The sequences from `first` on that one prefill serves: `first` and those after it sharing its prompt.
std::int64_t shared_prompt_run(const GenerationRequest& req, std::size_t first);

// One end of a fork: sequence `seq` of a GPU batch.
struct ForkSlot {
  GpuBatch* batch = nullptr;
  std::int64_t seq = 0;
};

// How much of a KV row a fork copies: the first `tokens` slots of each kv head (the whole
// row of `capacity` slots under eviction, where the policy's slots lie anywhere in it).
struct ForkExtent {
  std::int64_t tokens = 0, capacity = 0, n_kv_heads = 0, slot_bytes = 0;
  bool evicting = false;
};

// The KV bytes row copies moved (docs/prefix-sharing.md, "KV bytes copied"): K and V of every
// decoder layer copied, each byte read from the tier the source row lives on and written to
// the tier of the row it goes to, so both arrays hold the same total.
struct KvCopyBytes {
  std::array<std::int64_t, 3> read{}, written{};  // by offload::Tier
  std::int64_t total() const;
  void add(const KvCopyBytes& o);
};

// The row copies of a scheduler's runs, apart: the shared prompt prefixes newcomers took
// (StepPlan::prefixes) and the prefills forked into the n samples of a prompt (StepPlan::forks).
struct KvCopies {
  KvCopyBytes prefixes, forks;
  void add(const KvCopies& o);
};

// Prefixes held once (docs/prefix-sharing.md, "Holding a prefix once"): the KV cache the blocks
// placed with a pool (on the gpu tier), against the same rows each sized for a whole sequence;
// all 0 where no block held one.
struct KvHeld {
  // The prefix families, the pool rows they took turns in, and the prefills that filled a row.
  std::int64_t prefixes = 0, rows = 0, fills = 0;
  std::array<std::int64_t, 3> pools{};  // by offload::Tier: the blocks whose pool lives there
  // By offload::Tier, K and V of every layer: the pool and the rows, and the rows sized for
  // whole sequences instead.
  std::array<std::int64_t, 3> bytes{}, bytes_without{};
  std::int64_t total() const;
  std::int64_t total_without() const;
  void add(const KvHeld& o);
};

// Copies `from` into `to` in every layer of `layers` (and the eviction state with a KV
// policy), once the copies that stored either row have finished; returns when done, with the
// bytes it moved.
KvCopyBytes fork_slot(offload::Tiers& tiers, offload::Staging& staging, const offload::CopyOptions& opts,
                      std::span<const std::int64_t> layers, const ForkSlot& from, const ForkSlot& to,
                      const ForkExtent& extent);

}  // namespace flexh2o::engine
