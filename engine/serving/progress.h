// A batch job's progress line: requests done, prompt and generated tokens per second over a
// recent window, elapsed time and the time left. On a terminal it redraws one line with a bar
// (as tqdm does for vLLM's offline users); to a file or a pipe it writes a plain line now and
// then, so a log of a two-hour job says in its first minute how long the job will take.
//
// The time left is the work still to come at the measured cost of a row: the prompt rows the
// waiting requests will compute and the tokens still to be sampled, each at its seconds per row
// fitted to the recent steps (least squares over the steps' times, prompt rows and sampled
// rows): a job whose slots are still filling spends its steps on prompts, and the tokens alone
// would price the decode to come at the prefill's rate (a ShareGPT job said 9 minutes left of
// 5 at 30%). Where the steps do not tell the two apart (always in the same proportion), a row
// is a row; where they have no prompt rows, a prompt row costs what the job's steps with prompt
// rows took a row (a decode over a 3,000-token context costs 5x a prompt row: 3:30 left of 0:48).
// The context the running requests attend over is a third cost, fitted once the steps show it
// clearly (the tokens to come attend over their prompts and the tokens before them).
// The tokens to come: each unfinished request's expected tokens within its limit, given what
// it has generated so far, from the chance that a request that generated t tokens stops at the
// next (a Kaplan-Meier estimate over the requests seen: those a stop ended are the events,
// those that reached their limit and those still running count as at risk up to their
// lengths), so that the short requests that end first do not stand for the long ones still
// running. Past the lengths enough requests reached, the chance per token over the longer half
// of those stands in (before any, the job's: stops over tokens sampled); with no stop seen,
// every request runs to its limit. The prompt rows to come: the waiting requests' prompt tokens
// at the share of the started requests' prompt tokens the steps computed (shared prefixes and
// forks compute fewer).
// The costs are measured from the job's steady state on: the first step that only decoded, or
// the first after which no more requests ran than after the one before (the slots as full as
// they get; where the running requests are not known, the first request that ended), over the
// steps of the last half of it (at least the window). Before, the first prompts' prefill
// samples few tokens a second while the slots fill: a 30-second job said 17 minutes left. Until
// there is a measurement, the planner's predicted rate stands in, marked "planned".
#pragma once
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/runtime/sequence.h"

namespace flexh2o::serving {

// The running requests (GenerationLog::running).
using RunningCounts = std::function<std::vector<engine::RunningSequence>()>;

struct ProgressOptions {
  std::size_t requests = 0;           // of the job (those done before a resume not counted)
  std::vector<std::int64_t> limits;   // each request's max_tokens
  std::int64_t prompt_tokens = 0;     // their prompts' tokens (0: not known, no prompt rows to come)
  RunningCounts running;              // null: not known (the running requests count as waiting)
  double planned_tokens_per_second = 0;  // the planner's generated tok/s (0: none)
  // The planner's seconds a step spends per token of context its rows attend over (0: none):
  // the context's cost until the steps measure it.
  double planned_context_seconds = 0;
  bool terminal = false;              // redraw one line with a bar, else plain lines
  double line_seconds = 30;           // plain lines: at most one per this long (and at each tenth)
  double window_seconds = 30;         // the rates' window
};

// The figures a line shows, at one moment.
struct ProgressFigures {
  std::size_t done = 0, requests = 0;
  double elapsed = 0;
  double prompt_rate = 0, generated_rate = 0;  // tok/s over the window
  std::optional<double> seconds_left;          // none: nothing to estimate from yet
  bool planned = false;                        // seconds_left from the planner's rate
};

class Progress {
 public:
  Progress(ProgressOptions options, std::FILE* out);

  // `rows` more tokens were sampled (a step's sequence rows) at `now` (seconds into the job) by
  // a step that computed `prompt_rows` prompt rows.
  void sampled(std::int64_t rows, double now, std::int64_t prompt_rows = 0);
  // A request ended at `now` with these counts.
  void finished(std::int64_t prompt_tokens, std::int64_t generated_tokens, std::int64_t max_tokens, double now);
  // Draws (terminal) or writes (when one is due) the line for `now`.
  void show(double now);
  // The last line, whatever is due (ended with a newline on a terminal too); in a log, none
  // when the last one written already had every request done.
  void close(double now);

  ProgressFigures figures(double now) const;
  // "requests 90/200 (45%) | prompt 512 tok/s, generated 1203 tok/s | 00:10 elapsed, 00:12 left"
  static std::string text(const ProgressFigures& f);
  // The terminal's form: the text behind a bar of `width` cells.
  static std::string bar_text(const ProgressFigures& f, int width);

 private:
  struct Sample {
    double at = 0;
    std::int64_t prompt = 0, sampled = 0;
  };
  void record(double now);
  // The job's steady state begins at `now` (once): the time left is measured from there.
  void steady_from(double now);
  // The tokens the unfinished requests are expected to generate, and the context their
  // steps attend over (each token's prompt and the tokens before it, summed).
  struct WorkLeft {
    double tokens = 0, context = 0;
  };
  WorkLeft work_left(const std::vector<engine::RunningSequence>& running) const;
  // The prompt tokens of the requests started (finished or running) and not started, and the
  // prompt rows those not started are expected to compute.
  double started_prompt_tokens(const std::vector<engine::RunningSequence>& running) const;
  double waiting_prompt_tokens(const std::vector<engine::RunningSequence>& running) const;
  double prompt_rows_left(const std::vector<engine::RunningSequence>& running) const;
  // Seconds a prompt row, a sampled row and a token of context attended take over the measured
  // steps; none before there is a measurement.
  struct RowCosts {
    double prompt = 0, sampled = 0, context = 0;
  };
  std::optional<RowCosts> row_costs(double now) const;

  ProgressOptions o_;
  std::FILE* out_;
  std::size_t done_ = 0;
  std::int64_t prompt_done_ = 0, sampled_ = 0;
  // Over lengths [0, the longest open limit + 1]: the chance a request generates a t-th token
  // (reach[t], 1 for t <= 1) and the sum of those chances up to t (sum[t]).
  struct Reach {
    std::vector<double> reach, sum, length_sum;  // length_sum[t]: of u x reach[u] up to t
  };
  Reach reach(const std::vector<engine::RunningSequence>& running) const;

  std::int64_t generated_done_ = 0;
  std::int64_t stopped_ = 0;  // finished requests a stop ended before their limit
  // Finished requests' generated tokens, and whether a stop ended them; the limits of those not
  // finished (a count per limit).
  std::vector<std::pair<std::int64_t, bool>> ends_;
  std::map<std::int64_t, std::int64_t> open_limits_;
  std::size_t last_running_ = 0;  // requests running after the last step (until the steady state)
  std::deque<Sample> window_;
  // The steps since the steady state began, the last half of it kept (at least the window).
  struct StepCost {
    double at = 0, seconds = 0;
    double prompt = 0, sampled = 0;  // rows
    double context = 0;              // tokens the running requests attend over
  };
  std::deque<StepCost> steps_;
  double last_step_at_ = 0;
  std::int64_t prompt_rows_ = 0;  // computed by the steps so far
  double prefill_seconds_ = 0, prefill_rows_ = 0;  // the steps with prompt rows: their time and prompt rows
  // Where the steady state began (a step only decoded, or a request ended); none yet: the
  // time left is the planner's.
  std::optional<Sample> steady_;
  double last_line_ = -1;  // when the last line was written or drawn
  std::size_t last_tenth_ = 0;
  std::size_t done_written_ = static_cast<std::size_t>(-1);  // requests done at the last plain line
};

// "mm:ss", or "h:mm:ss" from an hour on.
std::string clock_text(double seconds);

}  // namespace flexh2o::serving
