#include "engine/distributed/pipeline_stage.h"

#include <algorithm>

#include <chrono>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace flexh2o::distributed {

namespace {

constexpr int kTagHidden = 101, kTagTokens = 102, kTagLogprobs = 103;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Slot {
  engine::GenerationRequest req;
  engine::BlockScheduler::BlockPtr block;
  std::size_t chunk = 0;
  bool awaiting_tokens = false;  // ran a step whose tokens the last stage has not sent yet
};

// The request of block `chunk` of the job: prompts [chunk x block, ...).
engine::GenerationRequest block_request(const PipelineWork& work, std::size_t chunk) {
  const auto block = static_cast<std::size_t>(work.block);
  const auto first = static_cast<std::ptrdiff_t>(chunk * block);
  const auto end = static_cast<std::ptrdiff_t>(std::min(work.prompts.size(), chunk * block + block));
  engine::GenerationRequest req;
  req.prompts.assign(work.prompts.begin() + first, work.prompts.begin() + end);
  req.streams.assign(work.streams.begin() + first, work.streams.begin() + end);
  req.max_new_tokens_each.assign(work.max_new_tokens.begin() + first, work.max_new_tokens.begin() + end);
  req.max_new_tokens = *std::max_element(req.max_new_tokens_each.begin(), req.max_new_tokens_each.end());
  req.sampling_each.assign(work.sampling.begin() + first, work.sampling.begin() + end);
  if (work.stop_here)
    req.stop_here = [&work, first](std::size_t b, std::span<const std::int32_t> generated) {
      return work.stop_here(static_cast<std::size_t>(first) + b, generated);
    };
  return req;
}

// A finished block's log-probabilities as the last stage sends them to the first.
Bytes logprobs_bytes(std::size_t chunk, const engine::GenerationResult& r) {
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
  return to_bytes({{"chunk", chunk}, {"logprobs", r.logprobs}, {"top_logprobs", top}});
}

// The first stage's result of block `chunk` takes the log-probabilities the last stage sent.
void take_logprobs(const Bytes& bytes, std::size_t chunk, engine::GenerationResult& r) {
  const nlohmann::json j = from_bytes(bytes);
  if (j.at("chunk").get<std::size_t>() != chunk)
    throw std::runtime_error("log-probabilities of block " + std::to_string(j["chunk"].get<std::size_t>()) +
                             " came where block " + std::to_string(chunk) + " finished (the stages disagree)");
  r.logprobs = j.at("logprobs").get<std::vector<std::vector<float>>>();
  r.top_logprobs.assign(r.logprobs.size(), {});
  for (std::size_t b = 0; b < r.top_logprobs.size(); ++b)
    for (const auto& alternatives : j.at("top_logprobs").at(b)) {
      auto& a = r.top_logprobs[b].emplace_back();
      for (const auto& t : alternatives) a.push_back({t.at(0).get<std::int32_t>(), t.at(1).get<float>()});
    }
}

}  // namespace

StageStats run_pipeline_stage(const Mpi& mpi, engine::BlockScheduler& sched, const PipelineWork& work,
                              offload::Trace* trace,
                              const std::function<void(std::size_t, const engine::GenerationResult&)>& finished,
                              const StageControl& control) {
  const int me = mpi.rank(), last = mpi.size() - 1;
  if (sched.holds_input() != (me == 0) || sched.holds_head() != (me == last))
    throw std::logic_error("pipeline rank " + std::to_string(me) + " holds the wrong end of the model");
  if (work.block < 1 || work.micro_batches < 1) throw std::invalid_argument("a pipeline needs blocks and micro-batches");
  StageStats stats;
  const double t0 = now_seconds();
  std::deque<PendingSend> sends;
  // Completed sends let go of their buffers; testing them also lets MPI progress.
  auto progress = [&] {
    while (!sends.empty() && sends.front().test()) sends.pop_front();
  };
  auto waiting = [&](const char* what, std::size_t slot, const std::function<void()>& receive) {
    offload::ScopedSpan span(trace, "pipeline", what, "slot " + std::to_string(slot));
    const double w0 = now_seconds();
    receive();
    stats.wait_seconds += now_seconds() - w0;
  };
  std::size_t current = 0;  // the slot whose step runs
  engine::StageLinks links;
  if (me > 0)
    links.receive = [&](std::int64_t, std::span<float> hidden) {
      progress();
      waiting("wait_hidden", current, [&] {
        mpi.recv_into(me - 1, kTagHidden, std::as_writable_bytes(hidden), "hidden states from the previous stage");
      });
    };
  if (me < last)
    links.send = [&](std::int64_t, std::span<const float> hidden) {
      progress();
      const auto bytes = std::as_bytes(hidden);
      sends.push_back(mpi.isend(me + 1, kTagHidden, std::make_shared<const Bytes>(bytes.begin(), bytes.end())));
    };

  const auto prompts = static_cast<std::size_t>(work.prompts.size());
  const auto block = static_cast<std::size_t>(work.block);
  const std::size_t chunks = (prompts + block - 1) / block;
  std::size_t next_chunk = 0;
  stats.blocks = chunks;
  // Every stage reaches this at the same point of the same slot walk, so they agree.
  auto take_next = [&] {
    if (next_chunk == chunks || stats.stopped) return false;
    stats.stopped = control.stop_requested && mpi.any(control.stop_requested());
    return !stats.stopped;
  };
  // A finished block: the last stage, which sampled, sends its log-probabilities (when some
  // sequence asks) to the first as soon as it ends, so that the first need not wait.
  auto finish = [&](Slot& s) {
    engine::GenerationResult r = sched.finish(*s.block);
    if (!r.logprobs.empty() && me == last)
      sends.push_back(mpi.isend(0, kTagLogprobs, std::make_shared<const Bytes>(logprobs_bytes(s.chunk, r))));
    if (!r.logprobs.empty() && me == 0)
      waiting("wait_logprobs", current, [&] { take_logprobs(mpi.recv(last, kTagLogprobs), s.chunk, r); });
    stats.total.add(r);
    s.block.reset();
    ++stats.finished_blocks;
    finished(s.chunk, r);
  };
  std::vector<Slot> slots(static_cast<std::size_t>(work.micro_batches));
  for (bool any = true; any;) {
    any = false;
    for (current = 0; current < slots.size(); ++current) {
      Slot& s = slots[current];
      if (s.awaiting_tokens) {
        const auto next = sched.next_tokens(*s.block);
        waiting("wait_tokens", current, [&] {
          mpi.recv_into(last, kTagTokens, std::as_writable_bytes(next), "sampled tokens from the last stage");
        });
        sched.end_step(*s.block);
        s.awaiting_tokens = false;
      }
      if (s.block && !sched.active(*s.block)) finish(s);
      if (!s.block && take_next()) {
        s.req = block_request(work, next_chunk);
        s.block = sched.begin(s.req);
        s.chunk = next_chunk++;
      }
      if (!s.block) continue;
      any = true;
      if (control.before_step) control.before_step();
      sched.run_step(*s.block, links);
      if (me == last) {
        const auto next = std::as_bytes(sched.next_tokens(*s.block));
        const auto bytes = std::make_shared<const Bytes>(next.begin(), next.end());
        for (int r = 0; r < last; ++r) sends.push_back(mpi.isend(r, kTagTokens, bytes));
        sched.end_step(*s.block);
        if (!sched.active(*s.block)) finish(s);
      } else {
        s.awaiting_tokens = true;
      }
    }
  }
  for (auto& s : sends) s.wait();
  stats.wall_seconds = now_seconds() - t0;
  return stats;
}

}  // namespace flexh2o::distributed
