#include "engine/job/job_runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

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

bool stop_string_ends(const std::function<bool(const Request&, std::span<const std::int32_t>)>& seen,
                      const Request& r, std::span<const std::int32_t> generated) {
  return !r.stop.empty() && static_cast<std::int64_t>(generated.size()) >= r.sampling.min_tokens && seen(r, generated);
}

bool shares_prompt_of_previous(std::span<const Request> requests, std::size_t i) {
  return i > 0 && requests[i].choice > 0 && requests[i - 1].source == requests[i].source;
}

std::vector<std::shared_ptr<const engine::TokenConstraint>> request_constraints(std::span<const Request> requests,
                                                                               JobConstraints* constraints) {
  if (std::none_of(requests.begin(), requests.end(), [](const Request& r) { return r.constraint.has_value(); }))
    return {};
  if (!constraints) throw std::logic_error("requests with structured output need the job's constraints");
  std::vector<std::shared_ptr<const engine::TokenConstraint>> out;
  for (const Request& r : requests) out.push_back(r.constraint ? constraints->get(*r.constraint) : nullptr);
  return out;
}

namespace {

engine::GenerationRequest block_request(std::span<const Request> block, const BlockLoopOptions& opt) {
  engine::GenerationRequest req;
  if (opt.stop_string_seen)
    req.stop_here = [block, &opt](std::size_t b, std::span<const std::int32_t> generated) {
      return stop_string_ends(opt.stop_string_seen, block[b], generated);
    };
  req.max_new_tokens = 0;
  for (std::size_t i = 0; i < block.size(); ++i) {
    const Request& r = block[i];
    if (opt.share_prefill) req.shares_prompt.push_back(shares_prompt_of_previous(block, i));
    req.prompts.push_back(r.prompt);
    req.sampling_each.push_back(r.sampling);
    req.streams.push_back(r.stream);
    req.max_new_tokens_each.push_back(r.max_tokens);
    req.max_new_tokens = std::max(req.max_new_tokens, r.max_tokens);
  }
  req.constraints = request_constraints(block, opt.constraints);
  return req;
}

std::string abandoned_message(const std::string& results_in) {
  return "interrupted: the requests under way were abandoned; finished ones are in " +
         (results_in.empty() ? std::string("the output") : results_in + "; rerun with --resume to continue");
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Between steps: a second interrupt abandons the run, progress, the caller's hook.
void between_steps(const BlockLoopOptions& opt, const std::string& where) {
  if (opt.interrupts && opt.interrupts->abandon_requested()) throw Interrupted(abandoned_message(opt.results_in));
  if (opt.progress) fmt::print(stderr, "\r{}   ", where);
  if (opt.between_steps) opt.between_steps();
}

void add_timings(JobOutcome& outcome, std::span<const Request> requests, const engine::GenerationResult& r,
                 double offset) {
  for (std::size_t i = 0; i < requests.size(); ++i)
    if (!r.tokens[i].empty())
      outcome.timings.push_back({requests[i].id_json, static_cast<std::int64_t>(requests[i].prompt.size()),
                                 static_cast<std::int64_t>(r.tokens[i].size()), offset + r.first_token_at[i],
                                 offset + r.finished_at[i]});
}

// One request through the block's slots after another (those the source gives); each result
// goes on as it ends.
void run_continuous(engine::BlockScheduler& sched, std::span<const Request> requests, const BlockLoopOptions& opt,
                    const BlockFinished& finished, JobOutcome& outcome) {
  engine::GenerationRequest req = block_request(requests, opt);
  req.slots = static_cast<std::int64_t>(opt.block);
  req.prefill_budget = opt.prefill_budget;
  req.stop_admitting = [&] { return outcome.stopped = opt.interrupts && opt.interrupts->stop_requested(); };
  if (opt.source)
    req.next_prompt = [&](std::size_t from, bool idle) {
      const std::optional<std::size_t> next = opt.source->next(from, idle);
      return next == RequestSource::kNoneLeft ? std::optional(requests.size()) : next;
    };
  req.on_finished = [&](std::size_t b, const engine::GenerationResult& so_far) {
    finished(requests.subspan(b, 1), so_far.sequence(b));
    ++outcome.finished_requests;
  };
  req.on_step = [&](std::int64_t step, std::int64_t) {
    between_steps(opt, fmt::format("requests {}/{} done, step {}", outcome.finished_requests, requests.size(), step + 1));
  };
  const engine::GenerationResult r = sched.generate(req);
  if (opt.progress) fmt::print(stderr, "\r\033[K");
  outcome.total.add(r);
  add_timings(outcome, requests, r, 0.0);
}

// The next block: up to opt.block of the requests from `from` on that the source gives (all in
// order without one); `from` moves past them.
std::vector<Request> next_block(std::span<const Request> requests, const BlockLoopOptions& opt, std::size_t& from) {
  std::vector<Request> block;
  while (block.size() < opt.block && from < requests.size()) {
    const std::size_t next = opt.source ? *opt.source->next(from, true) : from;
    if (next >= requests.size()) break;  // none left
    block.push_back(requests[next]);
    from = next + 1;
  }
  return block;
}

void run_fixed(engine::BlockScheduler& sched, std::span<const Request> requests, const BlockLoopOptions& opt,
               const BlockFinished& finished, JobOutcome& outcome, std::chrono::steady_clock::time_point t0) {
  const std::size_t blocks = (requests.size() + opt.block - 1) / opt.block;
  const std::string of = opt.source ? std::string() : fmt::format("/{}", blocks);
  for (std::size_t from = 0, b = 0;; ++b) {
    if (opt.interrupts && opt.interrupts->stop_requested()) {
      outcome.stopped = from < requests.size();
      break;
    }
    const std::vector<Request> block = next_block(requests, opt, from);
    if (block.empty()) break;
    engine::GenerationRequest req = block_request(block, opt);
    req.on_step = [&](std::int64_t step, std::int64_t steps) {
      between_steps(opt, fmt::format("block {}{}, step {}/{}", b + 1, of, step + 1, steps));
    };
    const double start = seconds_since(t0);
    const engine::GenerationResult r = sched.generate(req);
    if (opt.progress) fmt::print(stderr, "\r\033[K");
    finished(block, r);
    outcome.total.add(r);
    outcome.finished_requests += block.size();
    add_timings(outcome, block, r, start);
  }
}

}  // namespace

JobOutcome run_blocks(engine::BlockScheduler& sched, std::span<const Request> requests, const BlockLoopOptions& opt,
                      const BlockFinished& finished) {
  JobOutcome outcome;
  outcome.requests = requests.size();
  const auto t0 = std::chrono::steady_clock::now();
  if (opt.continuous && !requests.empty())
    run_continuous(sched, requests, opt, finished, outcome);
  else
    run_fixed(sched, requests, opt, finished, outcome, t0);
  outcome.wall_seconds = seconds_since(t0);
  return outcome;
}

}  // namespace flexh2o::job
