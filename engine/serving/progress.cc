#include "engine/serving/progress.h"

#include <fmt/format.h>

#include <algorithm>
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

void Progress::sampled(std::int64_t rows, double now, bool prefilled) {
  sampled_ += rows;
  record(now);
  // The slots are as full as they get once the running requests stop growing in number.
  bool full = false;
  if (!steady_ && o_.running) {
    const std::size_t running = o_.running().size();
    full = running > 0 && running <= last_running_;
    last_running_ = running;
  }
  if (!prefilled || full) steady_from(now);
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

Progress::Reach Progress::reach(const std::vector<std::pair<std::int64_t, std::int64_t>>& running) const {
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
  for (const auto& [len, limit] : running) ++reached[at(len)];
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
  for (std::size_t t = 1; t < n; ++t) {
    r.sum[t] = r.sum[t - 1] + r.reach[t];
    if (t + 1 == n) break;
    const double stop = reached[t] >= kMinAtRisk ? static_cast<double>(stops[t]) / static_cast<double>(reached[t]) : pooled;
    r.reach[t + 1] = r.reach[t] * (1 - std::clamp(stop, 0.0, 1.0));
  }
  return r;
}

double Progress::expected_tokens_left() const {
  if (open_limits_.empty()) return 0;
  const std::vector<std::pair<std::int64_t, std::int64_t>> running =
      o_.running ? o_.running() : std::vector<std::pair<std::int64_t, std::int64_t>>{};
  const Reach r = reach(running);
  const auto last = static_cast<std::int64_t>(r.sum.size()) - 1;
  auto sum = [&](std::int64_t t) { return r.sum[static_cast<std::size_t>(std::clamp<std::int64_t>(t, 0, last))]; };
  // A request that generated g of its limit m and goes on: tokens g + 1 ... m, each as likely
  // as reaching it from g + 1.
  auto more = [&](std::int64_t g, std::int64_t m) {
    if (g >= m) return 0.0;
    const double from = r.reach[static_cast<std::size_t>(std::clamp<std::int64_t>(g + 1, 1, last))];
    return from > 0 ? (sum(m) - sum(g)) / from : 0.0;
  };
  double left = 0;
  for (const auto& [limit, count] : open_limits_) left += static_cast<double>(count) * more(0, limit);
  for (const auto& [g, m] : running) left += more(g, m) - more(0, m);  // counted above from no token
  // Running requests not known (a rank's requests are seen when they end): less what the
  // unfinished ones sampled so far.
  if (!o_.running) left = std::max(0.0, left - static_cast<double>(sampled_ - generated_done_));
  return left;
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
  // The time left: the rate over the window's part since the steady state began.
  const Sample& from = steady_ && steady_->at > first.at ? *steady_ : first;
  const double steady_span = now - from.at;
  const auto steady_tokens = last.sampled - from.sampled;
  const bool measured = steady_ && steady_span >= kMinWindowSeconds && steady_tokens >= kMinWindowTokens;
  if (done_ >= o_.requests) {
    f.seconds_left = 0.0;
  } else if (measured) {
    f.seconds_left = expected_tokens_left() * steady_span / static_cast<double>(steady_tokens);
  } else if (o_.planned_tokens_per_second > 0) {
    f.seconds_left = expected_tokens_left() / o_.planned_tokens_per_second;
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
