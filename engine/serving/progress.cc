#include "engine/serving/progress.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>

namespace flexh2o::serving {

namespace {

// A window shorter than this, or with fewer tokens, measures nothing yet (the first step's
// prefill would stand for the rate).
constexpr double kMinWindowSeconds = 2.0;
constexpr std::int64_t kMinWindowTokens = 16;
constexpr double kRedrawSeconds = 0.1;  // a terminal's line at most ten times a second
// Fewer requests than this that reached a length: their stops there say too little, and the
// job's chance per token stands in.
constexpr std::int64_t kMinAtRisk = 20;
// The context's cost per token is fitted from this many steps on, where its t statistic is at
// least this (a ShareGPT job's filling slots gave 26x the cost it settled at, from 10 steps).
constexpr std::size_t kMinContextSteps = 30;
constexpr double kMinContextT = 5;

std::string rate_text(double rate) { return rate >= 100 ? fmt::format("{:.0f}", rate) : fmt::format("{:.1f}", rate); }

}  // namespace

std::string clock_text(double seconds) {
  const auto s = static_cast<std::int64_t>(std::max(0.0, std::round(seconds)));
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
  return fmt::format("{:02}:{:02}", s / 60, s % 60);
}

Progress::Progress(ProgressOptions options, std::FILE* out) : o_(std::move(options)), out_(out) {
  window_.push_back({});
  for (const std::int64_t limit : o_.limits) ++open_limits_[limit];
}

void Progress::sampled(std::int64_t rows, double now, std::int64_t prompt_rows) {
  const double seconds = now - last_step_at_;
  last_step_at_ = now;
  sampled_ += rows;
  prompt_rows_ += prompt_rows;
  if (prompt_rows > 0) {
    prefill_seconds_ += seconds;
    prefill_rows_ += static_cast<double>(prompt_rows);
  }
  record(now);
  const std::vector<engine::RunningSequence> running = o_.running ? o_.running() : std::vector<engine::RunningSequence>{};
  if (steady_) {
    double context = 0;  // the tokens the running requests attend over
    for (const engine::RunningSequence& r : running) context += static_cast<double>(r.prompt + r.generated);
    steps_.push_back({now, seconds, static_cast<double>(prompt_rows), static_cast<double>(rows), context});
    const double kept = std::max(o_.window_seconds, (now - steady_->at) / 2);
    while (steps_.size() > 1 && steps_.front().at <= now - kept) steps_.pop_front();
    return;
  }
  // The slots are as full as they get once the running requests stop growing in number.
  const bool full = !running.empty() && running.size() <= last_running_;
  last_running_ = running.size();
  if (prompt_rows == 0 || full) steady_from(now);
}

void Progress::finished(std::int64_t prompt_tokens, std::int64_t generated_tokens, std::int64_t max_tokens,
                        double now) {
  ++done_;
  prompt_done_ += prompt_tokens;
  generated_done_ += generated_tokens;
  const bool stopped = generated_tokens < max_tokens;
  if (stopped) ++stopped_;
  ends_.emplace_back(generated_tokens, stopped);
  if (const auto it = open_limits_.find(max_tokens); it != open_limits_.end() && --it->second == 0) open_limits_.erase(it);
  record(now);
  if (!o_.running) steady_from(now);  // a rank's requests: their ends are all that is seen
}

void Progress::steady_from(double now) {
  if (!steady_) steady_ = Sample{now, prompt_done_, sampled_};
}

void Progress::record(double now) {
  window_.push_back({now, prompt_done_, sampled_});
  // Keep one sample at or before the window's start, so the window spans it whole.
  while (window_.size() > 2 && window_[1].at <= now - o_.window_seconds) window_.pop_front();
}

Progress::Reach Progress::reach(const std::vector<engine::RunningSequence>& running) const {
  const std::int64_t longest = open_limits_.empty() ? 0 : open_limits_.rbegin()->first;
  const auto n = static_cast<std::size_t>(longest + 2);
  // Per length t: the requests that generated at least t tokens (ended there or later, or
  // running past it), and those a stop ended at t.
  std::vector<std::int64_t> reached(n + 1, 0), stops(n, 0);
  auto at = [&](std::int64_t len) { return static_cast<std::size_t>(std::clamp<std::int64_t>(len, 0, longest + 1)); };
  for (const auto& [len, stopped] : ends_) {
    ++reached[at(len)];
    if (stopped) ++stops[at(len)];
  }
  for (const engine::RunningSequence& r : running) ++reached[at(r.generated)];
  for (std::size_t t = n; t-- > 0;) reached[t] += reached[t + 1];
  // Past the lengths enough requests reached: the chance of a stop over the longer half of
  // those lengths (the first tokens' stops, the short requests', would read the long ones as
  // shorter than they are); before any length has enough, the job's chance per token.
  std::size_t known = 0;
  while (known + 1 < n && reached[known + 1] >= kMinAtRisk) ++known;
  double tail_stops = 0, tail_reached = 0;
  for (std::size_t t = known / 2 + 1; t <= known; ++t) {
    tail_stops += static_cast<double>(stops[t]);
    tail_reached += static_cast<double>(reached[t]);
  }
  const double pooled = tail_reached > 0 ? tail_stops / tail_reached
                        : sampled_ > 0  ? static_cast<double>(stopped_) / static_cast<double>(sampled_)
                                        : 0.0;
  Reach r;
  r.reach.assign(n, 1.0);  // the first token always comes
  r.sum.assign(n, 0.0);
  r.length_sum.assign(n, 0.0);
  for (std::size_t t = 1; t < n; ++t) {
    r.sum[t] = r.sum[t - 1] + r.reach[t];
    r.length_sum[t] = r.length_sum[t - 1] + static_cast<double>(t) * r.reach[t];
    if (t + 1 == n) break;
    const double stop = reached[t] >= kMinAtRisk ? static_cast<double>(stops[t]) / static_cast<double>(reached[t]) : pooled;
    r.reach[t + 1] = r.reach[t] * (1 - std::clamp(stop, 0.0, 1.0));
  }
  return r;
}

Progress::WorkLeft Progress::work_left(const std::vector<engine::RunningSequence>& running) const {
  if (open_limits_.empty()) return {};
  const Reach r = reach(running);
  const auto last = static_cast<std::int64_t>(r.sum.size()) - 1;
  auto at = [&](const std::vector<double>& v, std::int64_t t) {
    return v[static_cast<std::size_t>(std::clamp<std::int64_t>(t, 0, last))];
  };
  // A request of `prompt` tokens that generated g of its limit m and goes on: tokens g + 1 ...
  // m, each as likely as reaching it from g + 1; the t-th attends over prompt + t tokens.
  auto more = [&](double prompt, std::int64_t g, std::int64_t m) {
    const double from = g < m ? at(r.reach, g + 1) : 0.0;
    if (from <= 0) return WorkLeft{};
    const double tokens = (at(r.sum, m) - at(r.sum, g)) / from;
    return WorkLeft{tokens, prompt * tokens + (at(r.length_sum, m) - at(r.length_sum, g)) / from};
  };
  WorkLeft left;
  auto add = [&](const WorkLeft& w, double times) {
    left.tokens += times * w.tokens;
    left.context += times * w.context;
  };
  // Every open request from no token at the mean prompt of those not started, then the running
  // ones instead from where they are.
  const double waiting = static_cast<double>(o_.requests - done_) - static_cast<double>(running.size());
  const double prompt = waiting_prompt_tokens(running) / std::max(1.0, waiting);
  for (const auto& [limit, count] : open_limits_) add(more(prompt, 0, limit), static_cast<double>(count));
  for (const engine::RunningSequence& s : running) {
    add(more(prompt, 0, s.limit), -1);
    add(more(static_cast<double>(s.prompt), s.generated, s.limit), 1);
  }
  // Running requests not known (a rank's requests are seen when they end): less what the
  // unfinished ones sampled so far.
  if (!o_.running) left.tokens = std::max(0.0, left.tokens - static_cast<double>(sampled_ - generated_done_));
  return left;
}

double Progress::started_prompt_tokens(const std::vector<engine::RunningSequence>& running) const {
  double started = static_cast<double>(prompt_done_);
  for (const engine::RunningSequence& s : running) started += static_cast<double>(s.prompt);
  return started;
}

double Progress::waiting_prompt_tokens(const std::vector<engine::RunningSequence>& running) const {
  return std::max(0.0, static_cast<double>(o_.prompt_tokens) - started_prompt_tokens(running));
}

double Progress::prompt_rows_left(const std::vector<engine::RunningSequence>& running) const {
  const double started = started_prompt_tokens(running);
  const double computed_share = started > 0 ? static_cast<double>(prompt_rows_) / started : 1.0;
  return waiting_prompt_tokens(running) * computed_share;
}

namespace {

// Least squares of y on the columns `cols` of x (at most 3): their coefficients (the others 0)
// and the t statistic of the last; none where the columns are (nearly) dependent.
struct Fit {
  std::array<double, 3> coef{};
  double last_t = 0;
};
std::optional<Fit> least_squares(const std::vector<std::array<double, 3>>& x, const std::vector<double>& y,
                                 const std::vector<int>& cols) {
  const int k = static_cast<int>(cols.size());
  std::array<std::array<double, 3>, 3> a{}, inv{};  // x'x, then its inverse (for the variance)
  std::array<double, 3> b{};                        // x'y
  for (std::size_t i = 0; i < y.size(); ++i)
    for (int r = 0; r < k; ++r) {
      for (int c = 0; c < k; ++c) a[r][c] += x[i][cols[r]] * x[i][cols[c]];
      b[r] += x[i][cols[r]] * y[i];
    }
  double size = 0;
  for (int r = 0; r < k; ++r) {
    size = std::max(size, a[r][r]);
    inv[r][r] = 1;
  }
  for (int c = 0; c < k; ++c) {  // Gauss-Jordan; x'x is symmetric positive semi-definite
    const double pivot = a[c][c];
    if (pivot <= 1e-12 * size) return std::nullopt;
    for (int r = 0; r < k; ++r) {
      if (r == c) continue;
      const double f = a[r][c] / pivot;
      for (int j = 0; j < k; ++j) {
        a[r][j] -= f * a[c][j];
        inv[r][j] -= f * inv[c][j];
      }
      b[r] -= f * b[c];
    }
  }
  Fit fit;
  for (int r = 0; r < k; ++r) fit.coef[cols[r]] = b[r] / a[r][r];
  double rss = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    double e = y[i];
    for (const int c : cols) e -= fit.coef[c] * x[i][c];
    rss += e * e;
  }
  const double dof = static_cast<double>(y.size()) - k, last = fit.coef[cols.back()];
  const double variance = dof > 0 ? rss / dof * inv[k - 1][k - 1] / a[k - 1][k - 1] : 0;
  fit.last_t = variance > 0 ? last / std::sqrt(variance) : std::copysign(HUGE_VAL, last);
  return fit;
}

}  // namespace

std::optional<Progress::RowCosts> Progress::row_costs(double now) const {
  if (!steady_ || steps_.empty()) return std::nullopt;
  std::vector<std::array<double, 3>> x;
  std::vector<double> y;
  double t = 0, prompt = 0, sampled = 0;
  for (const StepCost& s : steps_) {
    x.push_back({s.prompt, s.sampled, s.context});
    y.push_back(s.seconds);
    t += s.seconds, prompt += s.prompt, sampled += s.sampled;
  }
  const double span = now - std::max(steady_->at, steps_.front().at - steps_.front().seconds);
  if (span < kMinWindowSeconds || sampled < static_cast<double>(kMinWindowTokens)) return std::nullopt;
  // The context's cost once the steps show it clearly (while the slots fill, the context grows
  // with the rows and a fit of three costs reads noise), else the planner's; then prompt and
  // sampled rows where the steps tell them apart; else a row is a row. Without prompt rows in
  // the steps, a prompt row costs what the job's steps with prompt rows took a row (a decode row
  // over a long prompt's context can cost 5x a prompt row), or a sampled row before any.
  std::vector<int> rows_cols = {1};
  if (prompt > 0) rows_cols.insert(rows_cols.begin(), 0);
  // A prompt row where the window has none: what the job's steps with prompt rows took a row.
  auto earlier_prompt_row = [&](double otherwise) { return prefill_rows_ > 0 ? prefill_seconds_ / prefill_rows_ : otherwise; };
  auto costs = [&](const Fit& f) { return RowCosts{prompt > 0 ? f.coef[0] : earlier_prompt_row(f.coef[1]), f.coef[1], f.coef[2]}; };
  std::vector<int> with_context = rows_cols;
  with_context.push_back(2);
  const std::optional<Fit> three = steps_.size() >= kMinContextSteps ? least_squares(x, y, with_context) : std::nullopt;
  if (three && three->last_t >= kMinContextT && three->coef[0] >= 0 && three->coef[1] > 0) return costs(*three);
  const double context = o_.planned_context_seconds;
  if (context > 0) {  // the rows priced from what the planner's context cost leaves of each step
    std::vector<double> rest = y;
    for (std::size_t i = 0; i < rest.size(); ++i) rest[i] -= context * x[i][2];
    std::optional<Fit> rows = least_squares(x, rest, rows_cols);
    if (rows && rows->coef[0] >= 0 && rows->coef[1] > 0) {
      rows->coef[2] = context;
      return costs(*rows);
    }
  }
  const std::optional<Fit> two = prompt > 0 ? least_squares(x, y, rows_cols) : std::nullopt;
  if (two && two->coef[0] >= 0 && two->coef[1] > 0) return costs(*two);
  const double row = t / (prompt + sampled);
  return RowCosts{prompt > 0 ? row : earlier_prompt_row(row), row, 0};
}

ProgressFigures Progress::figures(double now) const {
  ProgressFigures f{.done = done_, .requests = o_.requests, .elapsed = now};
  const Sample& first = window_.front();
  const Sample& last = window_.back();
  const double span = now - first.at;
  if (span > 0) {
    f.prompt_rate = static_cast<double>(last.prompt - first.prompt) / span;
    f.generated_rate = static_cast<double>(last.sampled - first.sampled) / span;
  }
  if (done_ >= o_.requests) {
    f.seconds_left = 0.0;
    return f;
  }
  const std::vector<engine::RunningSequence> running = o_.running ? o_.running() : std::vector<engine::RunningSequence>{};
  const WorkLeft work = work_left(running);
  if (const std::optional<RowCosts> cost = row_costs(now)) {
    f.seconds_left = cost->prompt * prompt_rows_left(running) + cost->sampled * work.tokens + cost->context * work.context;
  } else if (o_.planned_tokens_per_second > 0) {
    f.seconds_left = work.tokens / o_.planned_tokens_per_second;
    f.planned = true;
  }
  return f;
}

std::string Progress::text(const ProgressFigures& f) {
  const double percent = f.requests ? 100.0 * static_cast<double>(f.done) / static_cast<double>(f.requests) : 100.0;
  std::string left = "? left";
  if (f.seconds_left) left = clock_text(*f.seconds_left) + (f.planned ? " left (planned)" : " left");
  return fmt::format("requests {}/{} ({:.0f}%) | prompt {} tok/s, generated {} tok/s | {} elapsed, {}", f.done,
                     f.requests, std::floor(percent), rate_text(f.prompt_rate), rate_text(f.generated_rate),
                     clock_text(f.elapsed), left);
}

std::string Progress::bar_text(const ProgressFigures& f, int width) {
  const double part = f.requests ? static_cast<double>(f.done) / static_cast<double>(f.requests) : 1.0;
  const int filled = std::clamp(static_cast<int>(std::floor(part * width)), 0, width);
  return fmt::format("|{:#<{}}{:<{}}| {}", "", filled, "", width - filled, text(f));
}

void Progress::show(double now) {
  if (o_.terminal) {
    if (last_line_ >= 0 && now - last_line_ < kRedrawSeconds) return;  // steps can come hundreds a second
    last_line_ = now;
    fmt::print(out_, "\r\033[K{}", bar_text(figures(now), 20));
    std::fflush(out_);
    return;
  }
  const std::size_t tenth = o_.requests ? done_ * 10 / o_.requests : 10;
  if (last_line_ >= 0 && now - last_line_ < o_.line_seconds && tenth == last_tenth_) return;
  last_line_ = now;
  last_tenth_ = tenth;
  done_written_ = done_;
  fmt::print(out_, "{}\n", text(figures(now)));
  std::fflush(out_);
}

void Progress::close(double now) {
  if (o_.terminal) fmt::print(out_, "\r\033[K{}\n", bar_text(figures(now), 20));
  else if (done_written_ != done_ || done_ < o_.requests) fmt::print(out_, "{}\n", text(figures(now)));
  std::fflush(out_);
}

}  // namespace flexh2o::serving
