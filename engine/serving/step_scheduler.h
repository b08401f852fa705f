// Who runs each step of a block: which sequence each slot runs at each step and which cache
// rows are copied before it (a StepPlan, engine/runtime/step_plan.h), decided from what the
// request says (its sequences' prompts and shared prefills, prefill budget), what the
// SequenceFeed admits, and which sequences ended (BlockRun, block_run.h, records them). No model,
// no backend, no memory here: the plans are plain values.
//
// Continuous batching (req.slots > 0): free slots take the waiting sequences in order; each
// newcomer prefills its prompt, or only the rest of it after the longest prefix a cache row of
// the block holds, copied into its row first, or after its prefix family's row of a pool of
// prefixes held once (hold_prefixes; docs/prefix-sharing.md: a family holds a row while its
// requests run); a run of sequences
// sharing one prefill (Sequence::shares_prompt, engine/runtime/prefill_fork.h) takes a slot
// for each, the others idling as forks of the first for that step and copying its row after
// it. A fixed block (req.slots == 0): every prompt prefills at step 0 (forks idle) and all
// decode after.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/runtime/generator.h"
#include "engine/runtime/prefix_match.h"
#include "engine/runtime/step_plan.h"

namespace flexh2o::serving {

// Continuous batching: what a StepScheduler asks before free slots take waiting sequences.
// The defaults admit every sequence of the request in order.
class SequenceFeed {
 public:
  virtual ~SequenceFeed() = default;
  // Polled before waiting sequences take free slots; once true, no waiting one is admitted any
  // more (they end without tokens) and the run ends as the slots empty.
  virtual bool stop_admitting() { return false; }
  // Which waiting sequence a free slot takes, asked with the first one not yet taken or passed
  // (`from`) and whether no slot is running (`idle`: the answer may then wait, and must come).
  // Returns `from` or a later one (those passed are not this run's: data-parallel ranks share
  // a job's queue; they end without tokens, as dropped), the request's sequence count for none
  // left, or nullopt for none yet (the slot idles this step).
  virtual std::optional<std::size_t> next_sequence(std::size_t from, bool /*idle*/) { return from; }
};


class StepScheduler {
 public:
  // Over min(req.slots, prompts) slots under continuous batching, else over every prompt.
  // share_prefixes: newcomers may take prompt prefixes the rows hold (the executor knows when
  // the model allows it: BlockExecutor::shares_prefixes). `req` and `feed` (null: every
  // sequence in order) must outlive this.
  StepScheduler(const engine::GenerationRequest& req, std::int64_t gpu_batch_size, bool share_prefixes,
                SequenceFeed* feed = nullptr);
  // The block's slots: min(req.slots, prompts) under continuous batching, else every prompt.
  std::size_t slots() const { return slot_seq_.size(); }
  // Whether newcomers take prompt prefixes the rows hold (continuous batching, share_prefixes).
  bool shares_prefixes() const { return sharing_; }
  // The plan of the next step (the first call: step 0). Under continuous batching it polls the
  // feed's stop_admitting and asks it for the sequences free slots take.
  engine::StepPlan next_step();
  // Continuous batching, after the step planned last: slot `slot` computed `token` (the
  // sampled one, or a forced input in its place); `ended`: that ended its sequence.
  void record(std::size_t slot, std::int32_t token, bool ended);
  // A fixed block, after the step: every slot's next input (its finished sequences compute on).
  void record_all(std::span<const std::int32_t> next);
  // Per slot, its tokens so far, its prompt first (StepInput::tokens).
  std::span<const std::vector<std::int32_t>> tokens() const { return tokens_; }
  // Asked once, before step 0, where the executor can hold prefixes once: with shared
  // prefixes, the job's prefix families (prefix_families) held in pool rows, as many as the
  // most families the running requests hold at once (policy::Workload::pool_rows), when that
  // takes less memory than every row holding its whole sequence; else none. Once held, a
  // family's newcomer finding no row of its family takes a free one (none of the running
  // requests reads it; the least recently taken) and prefills its prefix into it; the
  // family's others extend after it while it stays theirs.
  engine::PrefixPool prefix_pool();
  // Then, where the executor placed that pool: the plans use it from step 0 on (else they copy
  // prefixes between rows, as without it).
  void hold_prefixes();

 private:
  // Whether a prompt waits for a free slot (waiting_): the next one the feed says this run
  // takes, those passed on the way dropped.
  bool prompt_waiting(bool idle, engine::StepPlan& plan);
  // Free slots take waiting prompts; which slots prefill a newcomer this step.
  std::vector<bool> admit(engine::StepPlan& plan);
  // The first waiting prompt takes `slot` (fork_of >= 0: as a fork of that slot's newcomer).
  void take_slot(std::size_t slot, std::int64_t fork_of);
  // Per slot, the tokens its cache row holds.
  std::vector<std::span<const std::int32_t>> held_rows() const;
  // Whether a newcomer of this step prefills a longer prefix of `prompt` than the rows hold now.
  bool prefix_in_flight(std::span<const std::int32_t> prompt, const engine::PrefixMatch& now,
                        const std::vector<bool>& newcomer) const;
  // The rows of this step's prefills copied into their forks (forks that ended copy nothing).
  std::vector<engine::RowCopy> take_forks();
  void lay_out(engine::StepPlan& plan, const std::vector<bool>& newcomer) const;
  // Slot `to`'s row now holds the first `tokens` slots of row `from` (itself: the slots it
  // keeps), then what it computes from there on.
  void copy_kv_runs(std::size_t to, std::size_t from, std::int64_t tokens);
  // The first slots whose KV bytes are copies of one computation in both rows.
  std::int64_t same_kv(std::size_t a, std::size_t b) const;
  // The groups of slots of each GPU batch that read one shared prefix (SlotStep::prefix_group).
  void group_prefixes(engine::StepPlan& plan) const;
  // Prefixes held once: how sequence `seq` starts. In no family it prefills into its own row;
  // where its family holds no pool row it takes a free one and prefills its prefix into it
  // (Fills), where its family's row is filled it extends after it (Extends); it waits while a
  // newcomer of this step fills its family's row, or while no row is free (Waits).
  enum class PoolStart : std::uint8_t { Alone, Fills, Extends, Waits };
  PoolStart pool_start(std::size_t seq) const;
  // The pool row no running request reads that was taken least recently (-1: none).
  std::int64_t free_pool_row() const;
  // Sequence seq takes its family's pool row (Fills: a free one, now its family's).
  void take_pool_row(std::size_t seq, PoolStart start);
  // Sequence seq's pool row (-1: none) and the tokens of its prefix held there.
  std::int64_t pool_row_of(std::size_t seq) const;
  std::int64_t held_tokens(std::size_t seq) const;

  const engine::GenerationRequest& req_;
  SequenceFeed& feed_;  // the one given, or one that admits every sequence in order
  std::size_t gpu_batch_size_;
  bool continuous_;
  bool sharing_;          // shared prompt prefixes apply
  bool planned_ = false;  // step 0 is planned
  std::vector<std::vector<std::int32_t>> tokens_;  // per slot
  // Each slot's sequence (-1: idle) and the first prompt not yet admitted.
  std::vector<std::int64_t> slot_seq_;
  std::size_t waiting_ = 0;
  // Per slot, the slot whose prefill of the step planned last it shares (-1: none).
  std::vector<std::int64_t> fork_of_;
  // Shared prompt prefixes: per slot, how many leading tokens of its tokens its cache row
  // holds (also after its request ended: a later one may start with them) and how many of
  // them its newcomer of this step took from a shared prefix (0: it prefills its whole prompt).
  std::vector<std::int64_t> held_, prefix_;
  // Where each row's KV bytes came from: runs of slots from `begin` up to the next run's begin,
  // each computed by one computation (`origin`: a row from an admission on); a copy takes the
  // source row's runs. Two rows hold the same bytes where their runs agree.
  struct KvRun {
    std::int64_t origin = 0, begin = 0;
  };
  std::vector<std::vector<KvRun>> kv_runs_;
  std::int64_t next_origin_ = 0;
  // Prefixes held once: the job's families, each one's pool row (-1: none), and per row the
  // family it holds, whether it is being filled (by this step) or filled, and the last time a
  // newcomer took it (a count of takes).
  bool holding_ = false;
  engine::PrefixFamilies families_;
  std::int64_t pool_rows_ = 0;
  std::vector<std::int64_t> family_row_;
  enum class RowState : std::uint8_t { Empty, Filling, Filled };
  struct PoolRow {
    std::int64_t family = -1;
    RowState state = RowState::Empty;
    std::int64_t taken = 0;
  };
  std::vector<PoolRow> pool_;
  std::int64_t takes_ = 0;
};

}  // namespace flexh2o::serving
