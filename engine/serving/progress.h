// A batch job's progress line: requests done, prompt and generated tokens per second over a
// recent window, elapsed time and the time left. On a terminal it redraws one line with a bar
// (as tqdm does for vLLM's offline users); to a file or a pipe it writes a plain line now and
// then, so a log of a two-hour job says in its first minute how long the job will take.
//
// The time left is the generated tokens still to come over the window's generated rate: the
// unfinished requests' limits less what they sampled, or where stop ids end requests early,
// 1 / p more tokens each, p the chance per token seen so far (requests a stop ended over the
// tokens sampled), whichever is less. The rate counts every token sampled (the engine's sequence rows), so the requests in
// flight count before they end. It is measured from the job's steady state on: the first step
// that only decoded or the first request that ended (before, the first prompts' prefill
// samples few tokens a second, and a 30-second job said 17 minutes left). Until the window
// holds a measurement, the planner's predicted rate stands in, marked "planned".
#pragma once
#include <cstdint>
#include <cstdio>
#include <deque>
#include <optional>
#include <string>

namespace flexh2o::serving {

struct ProgressOptions {
  std::size_t requests = 0;           // of the job (those done before a resume not counted)
  std::int64_t max_new_tokens = 0;    // the job's requests' limits, summed
  double planned_tokens_per_second = 0;  // the planner's generated tok/s (0: none)
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

  // `rows` more tokens were sampled (a step's sequence rows) at `now` (seconds into the job);
  // `prefilled`: the step computed prompt rows.
  void sampled(std::int64_t rows, double now, bool prefilled = false);
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
  double expected_tokens_left() const;

  ProgressOptions o_;
  std::FILE* out_;
  std::size_t done_ = 0;
  std::int64_t prompt_done_ = 0, sampled_ = 0;
  // Finished requests: their generated tokens and their limits (the share a request generates).
  std::int64_t generated_done_ = 0, limits_done_ = 0;
  std::int64_t stopped_ = 0;  // finished requests a stop ended before their limit
  std::deque<Sample> window_;
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
