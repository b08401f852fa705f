// Continuous batching: who runs each step of a block. Between steps the slots that ended free
// up (record_slots), the forks of this step's shared prefills take their KV (fork_slots), and
// free slots take waiting prompts (admit): each newcomer prefills its prompt, or only the rest
// of it after the longest prefix a cache row of the block holds, whose KV is copied into its
// row first (docs/prefix-sharing.md). next_steps then lays out every GPU batch's StepBatch.
#include <algorithm>
#include <stdexcept>
#include <utility>

#include "engine/model/kv_eviction.h"
#include "engine/model/rope_scaling.h"
#include "engine/runtime/block_state.h"
#include "engine/runtime/prefill_fork.h"
#include "engine/runtime/prefix_match.h"

namespace flexh2o::engine {

void BlockScheduler::record_slots(BlockState& st, GenerationLog& log) {
  std::int64_t computed = 0;
  bool prefilled = false;
  for (GpuBatch& b : st.batches)
    for (std::int64_t i = 0; i < b.n; ++i) {
      const SeqStep kind = b.step.kinds[static_cast<std::size_t>(i)];
      prefilled = prefilled || kind == SeqStep::Prefill || kind == SeqStep::Extend;
      const auto slot = static_cast<std::size_t>(b.first_sequence + i);
      // A fork sampled its first token from the prefill of this step it shares.
      const bool fork = st.fork_of[slot] >= 0;
      if (kind == SeqStep::Idle && !fork) continue;
      ++computed;
      auto& tokens = b.tokens[static_cast<std::size_t>(i)];
      std::int32_t token = st.next[slot];
      // The row holds every input so far (a fork's once fork_slots copied it, which it skips
      // for a fork that ends here); the tokens stay for a later prompt that starts with them.
      if (log.record_token(static_cast<std::size_t>(st.slot_seq[slot]), token)) {
        st.slot_seq[slot] = -1;  // free for the next prompt
        st.held[slot] = fork ? 0 : static_cast<std::int64_t>(tokens.size());
      } else {
        tokens.push_back(token);
        st.held[slot] = static_cast<std::int64_t>(tokens.size()) - 1;
      }
    }
  log.end_step(st.step, computed, prefilled);
}

void BlockScheduler::next_steps(BlockState& st) {
  const GenerationRequest& req = *st.req;
  if (st.waiting < req.prompts.size() && req.stop_admitting && req.stop_admitting())
    for (; st.waiting < req.prompts.size(); ++st.waiting) st.log->drop(st.waiting);
  const std::vector<bool> newcomer = admit(st);
  for (GpuBatch& b : st.batches) {
    StepBatch s;
    for (std::int64_t i = 0; i < b.n; ++i) {
      const auto slot = static_cast<std::size_t>(b.first_sequence + i);
      const auto& tokens = b.tokens[static_cast<std::size_t>(i)];
      // No request, or a fork waiting for the prefill of this step it shares.
      if (st.slot_seq[slot] < 0 || st.fork_of[slot] >= 0) {
        s.add_idle();
        continue;
      }
      if (newcomer[slot]) {
        if (st.prefix[slot] > 0)
          s.add_extend(tokens, st.prefix[slot]);
        else
          s.add_prefill(tokens);
        continue;
      }
      const auto cached = static_cast<std::int64_t>(tokens.size()) - 1;
      // Phi-3 prefills a sequence whole again when it outgrows the original context.
      if (rope_reprefills(cfg_, std::span(&cached, 1)))
        s.add_prefill(tokens);
      else
        s.add_decode(tokens.back(), cached);
    }
    b.step = std::move(s);
  }
}

bool BlockScheduler::prompt_waiting(BlockState& st, bool idle) {
  const GenerationRequest& req = *st.req;
  if (st.waiting >= req.prompts.size() || !req.next_prompt) return st.waiting < req.prompts.size();
  const std::optional<std::size_t> next = req.next_prompt(st.waiting, idle);
  if (!next && idle) throw std::logic_error("next_prompt gave no answer while no slot runs");
  if (!next) return false;
  if (*next < st.waiting) throw std::logic_error("next_prompt went back in the queue");
  for (const std::size_t to = std::min(*next, req.prompts.size()); st.waiting < to; ++st.waiting) st.log->drop(st.waiting);
  return st.waiting < req.prompts.size();
}

// Free slots take the waiting prompts in order, first come first served. A newcomer's prompt
// counts against its GPU batch's prefill budget (a batch's first newcomer joins whatever its
// length; after one that does not fit, the batch takes no more this step), less the prefix it
// takes from a cache row. A prompt whose longest prefix is being prefilled in this step by
// another newcomer waits for the next step, when that row holds it (admission stops there).
// The prompts sharing its prefill (shared_prompt_run, at most the block's slots) take the
// first other free slots, wherever they are, as forks of it; a run waits until there are free
// slots for all of it.
std::vector<bool> BlockScheduler::admit(BlockState& st) {
  const GenerationRequest& req = *st.req;
  const std::size_t slots = st.slot_seq.size();
  const auto gbs = static_cast<std::size_t>(policy_.gpu_batch_size);
  std::vector<bool> newcomer(slots, false);
  std::vector<std::size_t> free;
  for (std::size_t s = 0; s < slots; ++s)
    if (st.slot_seq[s] < 0) free.push_back(s);
  std::ranges::fill(st.prefix, 0);
  std::size_t left = free.size();
  std::vector<std::int64_t> prefilled(st.batches.size(), 0);  // prompt tokens per GPU batch
  std::vector<bool> batch_full(st.batches.size(), false);
  auto take = [&](std::size_t slot, std::int64_t fork_of) {
    st.slot_seq[slot] = static_cast<std::int64_t>(st.waiting);
    st.fork_of[slot] = fork_of;
    st.batches[slot / gbs].tokens[slot % gbs] = req.prompts[st.waiting];
    st.held[slot] = 0;  // its row is rewritten (or copied into) from here on
    ++st.waiting;
    --left;
  };
  bool idle = left == slots;
  for (const std::size_t f : free) {
    if (!prompt_waiting(st, idle)) break;
    if (st.slot_seq[f] >= 0) continue;  // a fork of a newcomer before it
    const std::size_t k = f / gbs;
    const std::vector<std::int32_t>& prompt = req.prompts[st.waiting];
    const PrefixMatch match = st.sharing ? longest_prefix(prompt, held_rows(st), static_cast<std::int64_t>(f),
                                                          req.min_shared_prefix)
                                         : PrefixMatch{};
    if (st.sharing && prefix_in_flight(st, prompt, match, newcomer)) break;
    const auto len = static_cast<std::int64_t>(prompt.size()) - match.tokens;
    batch_full[k] = batch_full[k] || (prefilled[k] > 0 && prefilled[k] + len > req.prefill_budget);
    if (batch_full[k]) continue;
    const auto run = static_cast<std::size_t>(std::min<std::int64_t>(shared_prompt_run(req, st.waiting), static_cast<std::int64_t>(slots)));
    if (run > left) break;
    for (auto& e : st.batches[k].eviction) e->reset(static_cast<std::int64_t>(f % gbs), sequence_tokens(req, st.waiting));
    newcomer[f] = true;
    prefilled[k] += len;
    take(f, -1);
    if (match.tokens > 0) share_prefix(st, match, f);
    idle = false;
    for (std::size_t j = 1, s = 0; j < run; ++j) {
      while (st.slot_seq[free[s]] >= 0) ++s;
      st.log->share_prefill(st.waiting);
      take(free[s], static_cast<std::int64_t>(f));
      st.forking = true;
    }
  }
  return newcomer;
}

std::vector<std::span<const std::int32_t>> BlockScheduler::held_rows(const BlockState& st) const {
  const auto gbs = static_cast<std::size_t>(policy_.gpu_batch_size);
  std::vector<std::span<const std::int32_t>> rows;
  for (std::size_t s = 0; s < st.held.size(); ++s)
    rows.push_back(std::span(st.batches[s / gbs].tokens[s % gbs]).first(static_cast<std::size_t>(st.held[s])));
  return rows;
}

// Whether a newcomer of this step prefills a longer prefix of `prompt` (by at least the
// fewest worth sharing) than the rows hold now: the prompt then waits a step for it.
bool BlockScheduler::prefix_in_flight(const BlockState& st, std::span<const std::int32_t> prompt,
                                      const PrefixMatch& now, const std::vector<bool>& newcomer) const {
  const auto gbs = static_cast<std::size_t>(policy_.gpu_batch_size);
  const std::int64_t least = std::max<std::int64_t>(st.req->min_shared_prefix, 1);
  const auto shareable = prompt.first(prompt.size() - 1);
  for (std::size_t s = 0; s < newcomer.size(); ++s) {
    if (!newcomer[s]) continue;
    const std::int64_t n = common_prefix(shareable, st.batches[s / gbs].tokens[s % gbs]);
    if (n >= least && n >= now.tokens + least) return true;
  }
  return false;
}

// The newcomer in slot `to` takes the first m.tokens of its prompt from row m.slot: copied
// now, before any compute of the step can write either row (its own row: kept as it is).
void BlockScheduler::share_prefix(BlockState& st, const PrefixMatch& m, std::size_t to) {
  const std::int64_t gbs = policy_.gpu_batch_size;
  st.prefix[to] = m.tokens;
  st.log->share_prefix(static_cast<std::size_t>(st.slot_seq[to]), m.tokens);
  st.held[to] = m.tokens;
  const auto dest = static_cast<std::int64_t>(to);
  if (m.slot == dest) return;
  auto slot_of = [&](std::int64_t s) { return ForkSlot{&st.batch(s / gbs), s % gbs}; };
  const ForkExtent extent{m.tokens, st.capacity, cfg_.n_kv_heads, kernels::kv_slot_bytes(cache_dtype_, cfg_.head_dim),
                          false};
  offload::ScopedSpan span(trace_, "compute", "share_prefix",
                           "slot " + std::to_string(m.slot) + " to " + std::to_string(dest));
  fork_slot(tiers_, *host_staging_, copies_->options(), units_.cache_layers, slot_of(m.slot), slot_of(dest), extent);
}

void BlockScheduler::fork_slots(BlockState& st) {
  const std::int64_t gbs = policy_.gpu_batch_size;
  auto slot_of = [&](std::int64_t s) { return ForkSlot{&st.batch(s / gbs), s % gbs}; };
  for (std::size_t s = 0; s < st.fork_of.size(); ++s) {
    const std::int64_t from = std::exchange(st.fork_of[s], -1);
    const std::int64_t seq = st.continuous ? st.slot_seq[s] : static_cast<std::int64_t>(s);
    if (from < 0 || seq < 0) continue;  // not a fork, or it ended with its first token
    const ForkExtent extent{static_cast<std::int64_t>(st.req->prompts[static_cast<std::size_t>(seq)].size()),
                            st.capacity, cfg_.n_kv_heads, kernels::kv_slot_bytes(cache_dtype_, cfg_.head_dim),
                            st.evicting};
    offload::ScopedSpan span(trace_, "compute", "fork_cache", "slot " + std::to_string(from) + " to " + std::to_string(s));
    fork_slot(tiers_, *host_staging_, copies_->options(), units_.cache_layers, slot_of(from),
              slot_of(static_cast<std::int64_t>(s)), extent);
  }
  st.forking = false;
}

}  // namespace flexh2o::engine
