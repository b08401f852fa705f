// Engine::step and the job it steps: the flights' blocks begun, stepped, recorded and
// finished; the job's queue shared by several flights; interrupts and progress between steps.
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "engine/serving/engine.h"
#include "engine/serving/engine_flight.h"
#include "engine/serving/step_scheduler.h"
#include "engine/runtime/prefill_fork.h"

namespace flexh2o::serving {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void add_timings(JobOutcome& outcome, std::span<const Request> requests, const engine::GenerationResult& r,
                 double offset) {
  for (std::size_t i = 0; i < requests.size(); ++i)
    if (!r.tokens[i].empty())
      outcome.timings.push_back({requests[i].id_json, static_cast<std::int64_t>(requests[i].prompt.size()),
                                 static_cast<std::int64_t>(r.tokens[i].size()), offset + r.first_token_at[i],
                                 offset + r.finished_at[i]});
}

// The next fixed block: the indices of up to `block` of the requests from `from` on that the
// source gives (all in order without one); `from` moves past them.
std::vector<std::size_t> next_block(std::span<const Request> requests, std::size_t block, RequestSource* source,
                                    std::size_t& from) {
  std::vector<std::size_t> out;
  while (out.size() < block && from < requests.size()) {
    const std::size_t next = source ? *source->next(from, true) : from;
    if (next >= requests.size()) break;  // none left
    out.push_back(next);
    from = next + 1;
  }
  return out;
}

}  // namespace

std::vector<Request> requests_at(std::span<const Request> requests, std::span<const std::size_t> at) {
  std::vector<Request> out;
  out.reserve(at.size());
  for (const std::size_t i : at) out.push_back(requests[i]);
  return out;
}

JobOutcome Engine::run(std::span<const Request> requests, const RequestsFinished& finished, RequestSource* source,
                       const std::function<void()>& between) {
  start(requests, finished, {.source = source, .between_steps = between});
  while (step()) {
  }
  return end();
}

void Engine::start(std::span<const Request> requests, RequestsFinished finished, JobFeed feed) {
  if (feed.flights < 1) throw std::invalid_argument("a job needs at least one flight");
  if (feed.source && feed.flights > 1) throw std::invalid_argument("a request source feeds one flight");
  job_ = std::make_unique<Job>();  // drops a job an exception left unfinished
  Job& j = *job_;
  j.requests = requests;
  j.finished = std::move(finished);
  j.feed = std::move(feed);
  for (std::size_t f = 0; f < j.feed.flights; ++f) j.flights.push_back(std::make_unique<Flight>());
  j.outcome.requests = requests.size();
  if (o_.progress) {
    ProgressOptions po = *o_.progress;
    po.requests = requests.size();
    po.limits.clear();
    po.prompt_tokens = 0;
    for (const Request& r : requests) {
      po.limits.push_back(r.max_tokens);
      po.prompt_tokens += static_cast<std::int64_t>(r.prompt.size());
    }
    po.running = [&j] {  // the flights' running requests
      std::vector<engine::RunningSequence> counts;
      for (const auto& f : j.flights)
        if (f->run)
          for (const auto& c : f->run->running()) counts.push_back(c);
      return counts;
    };
    j.progress.emplace(std::move(po), stderr);
  }
  j.t0 = std::chrono::steady_clock::now();
}

bool Engine::step(std::size_t flight, const StepLinks& links) {
  if (!job_) throw std::logic_error("Engine::step needs a job started");
  if (!exec_->holds_head() && !links.receive_tokens)
    throw std::logic_error("an engine without the output head needs the sampled tokens from the stage with it");
  Flight& f = *job_->flights.at(flight);
  if (f.pending) record_step(f, links);
  if (f.run && !f.run->active()) finish_block(f);
  if (!f.run && !begin_block(f)) return false;
  check_abandon();
  f.out = exec_->run_step(f.run->block(), f.run->next_step(), links.hidden);
  if (links.send_tokens) links.send_tokens(f.out.tokens);
  f.pending = true;
  return true;
}

JobOutcome Engine::end() {
  if (!job_) throw std::logic_error("Engine::end needs a job started");
  for (const auto& f : job_->flights)
    if (f->run) throw std::logic_error("Engine::end with a block in flight");
  JobOutcome outcome = std::move(job_->outcome);
  // Continuous: a poll said to stop while requests were left that this engine did not finish.
  if (o_.continuous && !job_->requests.empty())
    outcome.stopped = job_->stop_seen && outcome.finished_requests < outcome.requests;
  outcome.wall_seconds = seconds_since(job_->t0);
  if (job_->progress) job_->progress->close(outcome.wall_seconds);
  job_.reset();
  return outcome;
}

// The step's tokens (a stage without the head takes them from the one with it) recorded: ends,
// results handed on, the next step planned.
void Engine::record_step(Flight& f, const StepLinks& links) {
  if (links.receive_tokens) links.receive_tokens(f.out.tokens);
  f.pending = false;
  f.run->update(f.out);
  if (job_->progress) {
    const std::int64_t rows = f.run->rows_computed();
    job_->progress->sampled(rows - f.rows_counted, seconds_since(job_->t0), f.out.prompt_rows);
    f.rows_counted = rows;
  }
}

// A block whose first step has work: the flight's one continuous block, or the job's next
// fixed block (one with none to run ends at once and the next is taken).
bool Engine::begin_block(Flight& f) {
  const bool continuous = o_.continuous && !job_->requests.empty();
  while (continuous ? !f.started : begin_fixed(f)) {
    if (continuous) begin_continuous(f);
    f.run = std::make_unique<BlockRun>(*exec_, f.req, f.hooks, f.feed.get());
    f.rows_counted = 0;
    if (f.run->active()) return true;
    finish_block(f);
  }
  return false;
}

// A continuous flight's admissions: none once the job stops taking requests; those the job's
// source deals this engine, else those the job's queue gives the flight among several, else
// every request in order.
class Engine::FlightFeed final : public SequenceFeed {
 public:
  FlightFeed(Engine& engine, Flight& flight) : e_(engine), f_(flight) {}
  bool stop_admitting() override {
    const bool stop = e_.stop_now();
    e_.job_->stop_seen = e_.job_->stop_seen || stop;
    return stop;
  }
  std::optional<std::size_t> next_sequence(std::size_t from, bool idle) override {
    const Job& j = *e_.job_;
    if (j.feed.source) {
      const std::optional<std::size_t> next = j.feed.source->next(from, idle);
      return next == RequestSource::kNoneLeft ? std::optional(j.requests.size()) : next;
    }
    return j.flights.size() > 1 ? e_.queue_next(f_, from) : from;
  }

 private:
  Engine& e_;
  Flight& f_;
};

void Engine::begin_continuous(Flight& f) {
  Job& j = *job_;
  f.started = f.continuous = true;
  f.req = continuous_request(j.requests);
  f.feed = std::make_unique<FlightFeed>(*this, f);
  f.hooks = block_hooks(j.requests);
  f.hooks.on_finished = [this](std::size_t b, const engine::GenerationResult& own) {
    const std::size_t at[] = {b};
    job_->finished(at, own);
    count_finished(at, own);
  };
}

// The job's next fixed block for flight f, unless none is left or the job stops taking them.
bool Engine::begin_fixed(Flight& f) {
  Job& j = *job_;
  if (j.next >= j.requests.size() || j.outcome.stopped) return false;
  if (stop_now()) {
    j.outcome.stopped = true;
    return false;
  }
  f.at = next_block(j.requests, static_cast<std::size_t>(o_.policy.block_size()), j.feed.source, j.next);
  if (f.at.empty()) return false;
  f.these = requests_at(j.requests, f.at);
  f.req = block_request(f.these);
  f.hooks = block_hooks(f.these);
  f.begun_at = seconds_since(j.t0);
  return true;
}

void Engine::finish_block(Flight& f) {
  const engine::GenerationResult r = f.run->finish();
  f.run.reset();
  Job& j = *job_;
  j.outcome.total.add(r);
  if (f.continuous) {  // each request was handed on as it ended
    add_timings(j.outcome, j.requests, r, 0.0);
    return;
  }
  j.finished(f.at, r);
  count_finished(f.at, r);
  add_timings(j.outcome, f.these, r, f.begun_at);
}

bool Engine::stop_now() { return job_->feed.stop ? job_->feed.stop() : stop_requested(); }

// The job's next request (and those sharing its prefill, at most a block of them) goes to the
// first flight to ask past the last one it was given. Every pipeline stage's flights ask in
// the same order, so they get the same requests.
std::size_t Engine::queue_next(Flight& f, std::size_t from) {
  Job& j = *job_;
  if (f.given == Flight::kNoRequest || f.given < from) {
    f.given = std::min(j.next, j.requests.size());
    const auto run = static_cast<std::size_t>(engine::shared_prompt_run(f.req, f.given));
    j.next = f.given + std::min(run, static_cast<std::size_t>(o_.policy.block_size()));
  }
  return f.given;
}

// Between steps: a second interrupt abandons the run, progress, the job's hook.
void Engine::between_steps() const {
  check_abandon();
  if (job_->progress) job_->progress->show(seconds_since(job_->t0));
  if (job_->feed.between_steps) job_->feed.between_steps();
}

void Engine::count_finished(std::span<const std::size_t> at, const engine::GenerationResult& r) {
  Job& j = *job_;
  j.outcome.finished_requests += at.size();
  if (!j.progress) return;
  const double now = seconds_since(j.t0);
  for (std::size_t i = 0; i < at.size(); ++i) {
    const Request& req = j.requests[at[i]];
    j.progress->finished(static_cast<std::int64_t>(req.prompt.size()), static_cast<std::int64_t>(r.tokens[i].size()),
                         req.max_tokens, now);
  }
}

}  // namespace flexh2o::serving
