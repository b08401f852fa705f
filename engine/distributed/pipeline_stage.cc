#include "engine/distributed/pipeline_stage.h"

#include <algorithm>

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/runtime/prefill_fork.h"

namespace flexh2o::distributed {

namespace {

constexpr int kTagHidden = 101, kTagTokens = 102, kTagLogprobs = 103;
// Rounds of the slots between two polls of stop_requested under continuous batching: a poll
// makes every stage wait for the others (the pipeline drains), so not every round.
constexpr std::size_t kStopPollRounds = 8;
constexpr std::size_t kNoPrompt = static_cast<std::size_t>(-1);

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Slot {
  engine::GenerationRequest req;
  engine::BlockScheduler::BlockPtr block;
  std::size_t first = 0;         // fixed blocks: the block's first prompt
  bool started = false;          // continuous: the slot's block began (it serves the whole job)
  std::size_t given = kNoPrompt;  // continuous: the prompt the queue gave the slot, until it takes it
  bool awaiting_tokens = false;  // ran a step whose tokens the last stage has not sent yet
};

// The fixed block of prompts [first, first + work.block).
engine::GenerationRequest block_request(const PipelineWork& work, std::size_t first) {
  const auto end = std::min(work.prompts.size(), first + static_cast<std::size_t>(work.block));
  const auto from = static_cast<std::ptrdiff_t>(first), to = static_cast<std::ptrdiff_t>(end);
  engine::GenerationRequest req;
  req.prompts.assign(work.prompts.begin() + from, work.prompts.begin() + to);
  req.streams.assign(work.streams.begin() + from, work.streams.begin() + to);
  req.max_new_tokens_each.assign(work.max_new_tokens.begin() + from, work.max_new_tokens.begin() + to);
  req.max_new_tokens = *std::max_element(req.max_new_tokens_each.begin(), req.max_new_tokens_each.end());
  req.sampling_each.assign(work.sampling.begin() + from, work.sampling.begin() + to);
  if (!work.shares_prompt.empty()) {
    req.shares_prompt.assign(work.shares_prompt.begin() + from, work.shares_prompt.begin() + to);
    req.shares_prompt[0] = false;  // a run cut by the block's start prefills again
  }
  if (work.stop_here)
    req.stop_here = [&work, first](std::size_t b, std::span<const std::int32_t> generated) {
      return work.stop_here(first + b, generated);
    };
  if (!work.constraints.empty()) req.constraints.assign(work.constraints.begin() + from, work.constraints.begin() + to);
  return req;
}

// A continuous block over the whole job (the slot's queue hooks are set by the caller).
engine::GenerationRequest continuous_request(const PipelineWork& work) {
  engine::GenerationRequest req;
  req.prompts = work.prompts;
  req.streams = work.streams;
  req.max_new_tokens_each = work.max_new_tokens;
  req.max_new_tokens = *std::max_element(work.max_new_tokens.begin(), work.max_new_tokens.end());
  req.sampling_each = work.sampling;
  req.shares_prompt = work.shares_prompt;
  req.stop_here = work.stop_here;
  req.constraints = work.constraints;
  req.slots = work.block;
  req.prefill_budget = work.prefill_budget;
  return req;
}

// Log-probabilities as the last stage sends them to the first: of the fixed block or the one
// request whose first prompt is `first`.
Bytes logprobs_bytes(std::size_t first, const engine::GenerationResult& r) {
  nlohmann::json top = nlohmann::json::array();
  for (const auto& sequence : r.top_logprobs) {
    nlohmann::json per_token = nlohmann::json::array();
    for (const auto& alternatives : sequence) {
      nlohmann::json a = nlohmann::json::array();
      for (const kernels::TokenLogprob& t : alternatives) a.push_back({t.token, t.logprob});
      per_token.push_back(std::move(a));
    }
    top.push_back(std::move(per_token));
  }
  return to_bytes({{"first", first}, {"logprobs", r.logprobs}, {"top_logprobs", top}});
}

// The first stage's result at prompt `first` takes the log-probabilities the last stage sent.
void take_logprobs(const Bytes& bytes, std::size_t first, engine::GenerationResult& r) {
  const nlohmann::json j = from_bytes(bytes);
  if (j.at("first").get<std::size_t>() != first)
    throw std::runtime_error("log-probabilities of prompt " + std::to_string(j["first"].get<std::size_t>()) +
                             " came where prompt " + std::to_string(first) + " finished (the stages disagree)");
  r.logprobs = j.at("logprobs").get<std::vector<std::vector<float>>>();
  r.top_logprobs.assign(r.logprobs.size(), {});
  for (std::size_t b = 0; b < r.top_logprobs.size(); ++b)
    for (const auto& alternatives : j.at("top_logprobs").at(b)) {
      auto& a = r.top_logprobs[b].emplace_back();
      for (const auto& t : alternatives) a.push_back({t.at(0).get<std::int32_t>(), t.at(1).get<float>()});
    }
}

// One stage's walk over its slots, round after round, until no slot has work.
class StageLoop {
 public:
  StageLoop(const Mpi& mpi, engine::BlockScheduler& sched, const PipelineWork& work, offload::Trace* trace,
            const PromptsFinished& finished, const StageControl& control)
      : mpi_(mpi), sched_(sched), work_(work), trace_(trace), finished_(finished), control_(control),
        me_(mpi.rank()), last_(mpi.size() - 1), slots_(static_cast<std::size_t>(work.micro_batches)) {
    if (me_ > 0) links_.receive = [this](std::int64_t, std::span<float> hidden) { receive_hidden(hidden); };
    if (me_ < last_) links_.send = [this](std::int64_t, std::span<const float> hidden) { send_hidden(hidden); };
  }

  StageStats run() {
    const double t0 = now_seconds();
    for (bool any = true; any; ++round_) {
      any = false;
      if (work_.continuous) poll_stop();
      for (current_ = 0; current_ < slots_.size(); ++current_) any = visit(slots_[current_]) || any;
    }
    for (auto& s : sends_) s.wait();
    if (work_.continuous) stats_.stopped = stop_admitting_ && finished_requests_ < work_.prompts.size();
    stats_.wall_seconds = now_seconds() - t0;
    return stats_;
  }

 private:
  // The slot's turn: its last step's tokens, a new block when it has none, its next step.
  // Every stage records a step's tokens at the slot's next turn, the last stage too, so that
  // all of them admit requests (which ask the job's queue) in the same order.
  bool visit(Slot& s) {
    if (s.awaiting_tokens) take_tokens(s);
    if (s.block && !sched_.active(*s.block)) finish(s);
    if (!s.block && !begin(s)) return false;
    if (control_.before_step) control_.before_step();
    sched_.run_step(*s.block, links_);
    if (me_ == last_) {
      const auto next = std::as_bytes(sched_.next_tokens(*s.block));
      const auto bytes = std::make_shared<const Bytes>(next.begin(), next.end());
      for (int r = 0; r < last_; ++r) sends_.push_back(mpi_.isend(r, kTagTokens, bytes));
    }
    s.awaiting_tokens = true;
    return true;
  }

  // A block for an empty slot: the job's next fixed block, or (continuous) the slot's one
  // block over the whole job; false when there is none. A continuous block may have no
  // request left to take at its start: it ends at once.
  bool begin(Slot& s) {
    if (work_.continuous) {
      if (s.started) return false;
      s.started = true;
      s.req = continuous_request(work_);
      s.req.stop_admitting = [this] { return stop_admitting_; };
      s.req.next_prompt = [this, &s](std::size_t from, bool) { return queue_next(s, from); };
      // Every stage ends request b at the same step.
      s.req.on_finished = [this](std::size_t b, const engine::GenerationResult& so_far) {
        ++finished_requests_;
        prompts_finished(b, so_far.sequence(b));
      };
    } else {
      if (next_first_ >= work_.prompts.size() || stats_.stopped) return false;
      stats_.stopped = control_.stop_requested && mpi_.any(control_.stop_requested());
      if (stats_.stopped) return false;
      s.first = next_first_;
      next_first_ += static_cast<std::size_t>(work_.block);
      s.req = block_request(work_, s.first);
    }
    s.block = sched_.begin(s.req);
    if (sched_.active(*s.block)) return true;
    finish(s);
    return false;
  }

  // Continuous: the prompt the job's queue gives slot s, which asks from `from` on (those
  // before it another slot took); the slot keeps it until it takes it, with the prompts that
  // share its prefill (the scheduler admits them together, at most a block of them). Every
  // stage's slots ask in the same order, so they get the same prompts.
  std::optional<std::size_t> queue_next(Slot& s, std::size_t from) {
    if (s.given == kNoPrompt || s.given < from) {
      s.given = std::min(next_first_, work_.prompts.size());
      next_first_ = s.given + static_cast<std::size_t>(
                                  std::min(engine::shared_prompt_run(s.req, s.given), work_.block));
    }
    return s.given;
  }

  // Continuous: every few rounds the stages agree whether to stop taking requests.
  void poll_stop() {
    if (!control_.stop_requested || round_ % kStopPollRounds != 0 || stop_admitting_) return;
    stop_admitting_ = mpi_.any(control_.stop_requested());
  }

  // The last stage sampled them itself.
  void take_tokens(Slot& s) {
    const auto next = sched_.next_tokens(*s.block);
    if (me_ != last_)
      waiting("wait_tokens", [&] {
        mpi_.recv_into(last_, kTagTokens, std::as_writable_bytes(next), "sampled tokens from the last stage");
      });
    sched_.end_step(*s.block);
    s.awaiting_tokens = false;
  }

  void finish(Slot& s) {
    engine::GenerationResult r = sched_.finish(*s.block);
    s.block.reset();
    stats_.total.add(r);
    if (!work_.continuous) prompts_finished(s.first, std::move(r));
  }

  // Results at prompt `first`: the last stage, which sampled, sends their log-probabilities
  // (when some sequence asks) to the first as soon as they end, so that the first need not
  // wait; the first hands them on.
  void prompts_finished(std::size_t first, engine::GenerationResult r) {
    if (!r.logprobs.empty() && me_ == last_ && me_ != 0)
      sends_.push_back(mpi_.isend(0, kTagLogprobs, std::make_shared<const Bytes>(logprobs_bytes(first, r))));
    if (me_ != 0) return;
    if (!r.logprobs.empty() && last_ != 0)
      waiting("wait_logprobs", [&] { take_logprobs(mpi_.recv(last_, kTagLogprobs), first, r); });
    finished_(first, r);
  }

  void receive_hidden(std::span<float> hidden) {
    progress();
    waiting("wait_hidden", [&] {
      mpi_.recv_into(me_ - 1, kTagHidden, std::as_writable_bytes(hidden), "hidden states from the previous stage");
    });
  }

  void send_hidden(std::span<const float> hidden) {
    progress();
    const auto bytes = std::as_bytes(hidden);
    sends_.push_back(mpi_.isend(me_ + 1, kTagHidden, std::make_shared<const Bytes>(bytes.begin(), bytes.end())));
  }

  // Completed sends let go of their buffers; testing them also lets MPI progress.
  void progress() {
    while (!sends_.empty() && sends_.front().test()) sends_.pop_front();
  }

  void waiting(const char* what, const std::function<void()>& receive) {
    offload::ScopedSpan span(trace_, "pipeline", what, "slot " + std::to_string(current_));
    const double w0 = now_seconds();
    receive();
    stats_.wait_seconds += now_seconds() - w0;
  }

  const Mpi& mpi_;
  engine::BlockScheduler& sched_;
  const PipelineWork& work_;
  offload::Trace* trace_;
  const PromptsFinished& finished_;
  const StageControl& control_;
  const int me_, last_;
  std::vector<Slot> slots_;
  engine::StageLinks links_;
  std::deque<PendingSend> sends_;
  StageStats stats_;
  std::size_t current_ = 0;     // the slot whose step runs
  std::size_t round_ = 0;       // of the walk over the slots
  std::size_t next_first_ = 0;  // the job's first prompt no slot took yet
  bool stop_admitting_ = false;  // continuous: the stages agreed to stop taking requests
  std::size_t finished_requests_ = 0;  // continuous
};

}  // namespace

StageStats run_pipeline_stage(const Mpi& mpi, engine::BlockScheduler& sched, const PipelineWork& work,
                              offload::Trace* trace, const PromptsFinished& finished, const StageControl& control) {
  if (sched.holds_input() != (mpi.rank() == 0) || sched.holds_head() != (mpi.rank() == mpi.size() - 1))
    throw std::logic_error("pipeline rank " + std::to_string(mpi.rank()) + " holds the wrong end of the model");
  if (work.block < 1 || work.micro_batches < 1) throw std::invalid_argument("a pipeline needs blocks and micro-batches");
  if (work.prompts.empty()) return {};
  return StageLoop(mpi, sched, work, trace, finished, control).run();
}

}  // namespace flexh2o::distributed
