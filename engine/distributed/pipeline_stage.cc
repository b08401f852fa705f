#include "engine/distributed/pipeline_stage.h"

#include <algorithm>

#include <chrono>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string>

namespace flexh2o::distributed {

namespace {

constexpr int kTagHidden = 101, kTagTokens = 102;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Slot {
  engine::GenerationRequest req;
  engine::BlockScheduler::BlockPtr block;
  std::size_t chunk = 0;
  bool awaiting_tokens = false;  // ran a step whose tokens the last stage has not sent yet
};

}  // namespace

StageStats run_pipeline_stage(const Mpi& mpi, engine::BlockScheduler& sched, const PipelineWork& work,
                              offload::Trace* trace,
                              const std::function<void(std::size_t, const engine::GenerationResult&)>& finished) {
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
      if (s.block && !sched.active(*s.block)) {
        const engine::GenerationResult r = sched.finish(*s.block);
        stats.total.add(r);
        s.block.reset();
        finished(s.chunk, r);
      }
      if (!s.block && next_chunk < chunks) {
        const std::size_t first = next_chunk * block, end = std::min(prompts, first + block);
        s.req = {};
        s.req.prompts.assign(work.prompts.begin() + static_cast<std::ptrdiff_t>(first),
                             work.prompts.begin() + static_cast<std::ptrdiff_t>(end));
        s.req.streams.assign(work.streams.begin() + static_cast<std::ptrdiff_t>(first),
                             work.streams.begin() + static_cast<std::ptrdiff_t>(end));
        s.req.max_new_tokens_each.assign(work.max_new_tokens.begin() + static_cast<std::ptrdiff_t>(first),
                                         work.max_new_tokens.begin() + static_cast<std::ptrdiff_t>(end));
        s.req.max_new_tokens = *std::max_element(s.req.max_new_tokens_each.begin(), s.req.max_new_tokens_each.end());
        s.req.sampling_each.assign(work.sampling.begin() + static_cast<std::ptrdiff_t>(first),
                                   work.sampling.begin() + static_cast<std::ptrdiff_t>(end));
        s.block = sched.begin(s.req);
        s.chunk = next_chunk++;
      }
      if (!s.block) continue;
      any = true;
      sched.run_step(*s.block, links);
      if (me == last) {
        const auto next = std::as_bytes(sched.next_tokens(*s.block));
        const auto bytes = std::make_shared<const Bytes>(next.begin(), next.end());
        for (int r = 0; r < last; ++r) sends.push_back(mpi.isend(r, kTagTokens, bytes));
        sched.end_step(*s.block);
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
