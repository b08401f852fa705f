#include "engine/job/job_runner.h"

#include <fmt/format.h>

#include <algorithm>

namespace flexh2o::job {

std::vector<Request> requests_to_run(std::span<const Request> all, const std::optional<ResultFile>& out,
                                     bool resuming, const std::string& out_path) {
  std::vector<Request> todo;
  for (const Request& r : all)
    if (!out || !out->done_ids().count(r.id_json)) todo.push_back(r);
  if (resuming)
    fmt::print(stderr, "resuming: {} of {} prompts already in {}\n", all.size() - todo.size(), all.size(), out_path);
  return todo;
}

namespace {

engine::GenerationRequest block_request(std::span<const Request> block, const BlockLoopOptions& opt) {
  engine::GenerationRequest req;
  if (opt.stop_string_seen)
    req.stop_here = [block, &opt](std::size_t b, std::span<const std::int32_t> generated) {
      const Request& r = block[b];
      return !r.stop.empty() && static_cast<std::int64_t>(generated.size()) >= r.sampling.min_tokens &&
             opt.stop_string_seen(r, generated);
    };
  req.max_new_tokens = 0;
  for (const Request& r : block) {
    req.prompts.push_back(r.prompt);
    req.sampling_each.push_back(r.sampling);
    req.streams.push_back(r.stream);
    req.max_new_tokens_each.push_back(r.max_tokens);
    req.max_new_tokens = std::max(req.max_new_tokens, r.max_tokens);
  }
  return req;
}

std::string abandoned_message(const std::string& results_in) {
  return "interrupted: the unfinished block was abandoned; finished blocks are in " +
         (results_in.empty() ? std::string("the output") : results_in + "; rerun with --resume to continue");
}

}  // namespace

JobOutcome run_blocks(engine::BlockScheduler& sched, std::span<const Request> requests, const BlockLoopOptions& opt,
                      const BlockFinished& finished) {
  JobOutcome outcome;
  outcome.blocks = (requests.size() + opt.block - 1) / opt.block;
  for (std::size_t first = 0; first < requests.size(); first += opt.block) {
    if (opt.interrupts && opt.interrupts->stop_requested()) {
      outcome.stopped = true;
      break;
    }
    const auto block = requests.subspan(first, std::min(opt.block, requests.size() - first));
    engine::GenerationRequest req = block_request(block, opt);
    req.on_step = [&, b = outcome.finished_blocks](std::int64_t step, std::int64_t steps) {
      if (opt.interrupts && opt.interrupts->abandon_requested()) throw Interrupted(abandoned_message(opt.results_in));
      if (opt.progress) fmt::print(stderr, "\rblock {}/{}, step {}/{}   ", b + 1, outcome.blocks, step + 1, steps);
      if (opt.between_steps) opt.between_steps();
    };
    const engine::GenerationResult r = sched.generate(req);
    if (opt.progress) fmt::print(stderr, "\r\033[K");
    finished(block, r);
    outcome.total.add(r);
    ++outcome.finished_blocks;
  }
  return outcome;
}

}  // namespace flexh2o::job
